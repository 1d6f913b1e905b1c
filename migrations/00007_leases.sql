-- Concurrency leases (pgratelimit.Semaphore): one row per lease of a key.
--
-- A lease counts while expires_at is after the check's clock: until it is
-- released (its row deleted) or its TTL passes without an Extend, so the
-- units of a crashed holder come back by themselves. A row past expires_at
-- counts for nothing; cleanup deletes it (until then Release and Extend of
-- it say it expired). token is the lease's fencing token, from
-- pgratelimit_lease_tokens: it grows with every acquisition. Every writer of
-- a key's leases first locks the key's row in the bucket table of the same
-- storage (a placeholder whose balance is never used), so the rows need no
-- lock of their own.
--
-- pgratelimit_ephemeral_leases is the UNLOGGED twin (Storage Ephemeral):
-- PostgreSQL empties it after a crash, forgetting every lease. The sequence
-- is logged, so tokens never go back.

-- +goose Up
CREATE TABLE pgratelimit_leases (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    weight      bigint           NOT NULL CHECK (weight > 0),
    token       bigint           NOT NULL,
    acquired_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key, id)
) WITH (fillfactor = 80);

CREATE UNLOGGED TABLE pgratelimit_ephemeral_leases (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    weight      bigint           NOT NULL CHECK (weight > 0),
    token       bigint           NOT NULL,
    acquired_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key, id)
) WITH (fillfactor = 80);

CREATE SEQUENCE pgratelimit_lease_tokens;

-- +goose Down
DROP SEQUENCE pgratelimit_lease_tokens;
DROP TABLE pgratelimit_ephemeral_leases;
DROP TABLE pgratelimit_leases;

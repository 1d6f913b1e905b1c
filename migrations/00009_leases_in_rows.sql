-- Concurrency leases move into their key's row (pgratelimit.Semaphore).
--
-- Migration 00007 kept one row per lease in tables of their own, beside
-- the key's row in the bucket table that every writer of the key's leases
-- locks first. A lease operation then wrote three rows (the lease's, a
-- DELETE or an INSERT with its index entry, and the lock row's expiry).
-- Here the leases are a column of that very row: the statement that locks
-- it reads them, and one UPDATE (a HOT update, no index changes) writes
-- them back with the row's expiry, so that an acquisition or a release
-- costs what a check does.
--
-- leases (json: kept as written) is an array of the key's leases, NULL when
-- it has none: {"id", "weight", "token", "acquired_at", "expires_at",
-- "ttl"}, the times as JSON gives them (RFC 3339), ttl in nanoseconds. A
-- lease counts while expires_at is after the check's clock. An expired one
-- is remembered for its TTL more (Release and Extend of it say it expired),
-- then forgotten, as if never acquired (the next write of the key drops
-- it). The row's expires_at is kept at or past the time its last lease is
-- forgotten, so cleanup never deletes a row whose leases are remembered.
-- Storage Ephemeral keeps them in the UNLOGGED bucket table: PostgreSQL
-- empties it after a crash, forgetting every lease; the fencing tokens'
-- sequence (pgratelimit_lease_tokens) is logged, so tokens never go back.
--
-- The leases of 00007's tables move into the column (with their row's
-- expiry pushed past them), and the tables are dropped. On Citus the
-- tables were colocated by key: the move runs on each shard.

-- +goose Up
ALTER TABLE pgratelimit_buckets ADD COLUMN leases json;
ALTER TABLE pgratelimit_ephemeral_buckets ADD COLUMN leases json;

INSERT INTO pgratelimit_buckets AS b (prefix, key, tokens, refilled_at, expires_at, leases)
SELECT prefix, key, 0, timestamptz '0001-01-01 00:00:00+00', max(expires_at + (expires_at - acquired_at)),
       json_agg(json_build_object('id', id, 'weight', weight, 'token', token,
                                    'acquired_at', acquired_at, 'expires_at', expires_at,
                                    'ttl', (extract(epoch FROM expires_at - acquired_at) * 1000000000)::bigint) ORDER BY acquired_at, id)
FROM pgratelimit_leases
GROUP BY prefix, key
ON CONFLICT (prefix, key) DO UPDATE SET leases = excluded.leases, expires_at = greatest(b.expires_at, excluded.expires_at);

INSERT INTO pgratelimit_ephemeral_buckets AS b (prefix, key, tokens, refilled_at, expires_at, leases)
SELECT prefix, key, 0, timestamptz '0001-01-01 00:00:00+00', max(expires_at + (expires_at - acquired_at)),
       json_agg(json_build_object('id', id, 'weight', weight, 'token', token,
                                    'acquired_at', acquired_at, 'expires_at', expires_at,
                                    'ttl', (extract(epoch FROM expires_at - acquired_at) * 1000000000)::bigint) ORDER BY acquired_at, id)
FROM pgratelimit_ephemeral_leases
GROUP BY prefix, key
ON CONFLICT (prefix, key) DO UPDATE SET leases = excluded.leases, expires_at = greatest(b.expires_at, excluded.expires_at);

DROP TABLE pgratelimit_leases;
DROP TABLE pgratelimit_ephemeral_leases;

-- +goose Down
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

INSERT INTO pgratelimit_leases (prefix, key, id, weight, token, acquired_at, expires_at)
SELECT b.prefix, b.key, l.id, l.weight, l.token, l.acquired_at, l.expires_at
FROM pgratelimit_buckets b,
     json_to_recordset(b.leases) AS l(id text, weight bigint, token bigint, acquired_at timestamptz, expires_at timestamptz)
WHERE b.leases IS NOT NULL;

INSERT INTO pgratelimit_ephemeral_leases (prefix, key, id, weight, token, acquired_at, expires_at)
SELECT b.prefix, b.key, l.id, l.weight, l.token, l.acquired_at, l.expires_at
FROM pgratelimit_ephemeral_buckets b,
     json_to_recordset(b.leases) AS l(id text, weight bigint, token bigint, acquired_at timestamptz, expires_at timestamptz)
WHERE b.leases IS NOT NULL;

ALTER TABLE pgratelimit_ephemeral_buckets DROP COLUMN leases;
ALTER TABLE pgratelimit_buckets DROP COLUMN leases;

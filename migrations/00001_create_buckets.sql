-- pgratelimit's bucket tables: one row per (prefix, key).
-- tokens are as of refilled_at, a point on the bucket's refill grid;
-- expires_at is when the bucket is full again (rounded up): from then on the
-- row is equivalent to a missing one and may be deleted.

-- +goose Up
CREATE TABLE pgratelimit_buckets (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    tokens      bigint           NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key)
) WITH (fillfactor = 80);

CREATE UNLOGGED TABLE pgratelimit_ephemeral_buckets (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    tokens      bigint           NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key)
) WITH (fillfactor = 80);

-- +goose Down
DROP TABLE pgratelimit_ephemeral_buckets;
DROP TABLE pgratelimit_buckets;

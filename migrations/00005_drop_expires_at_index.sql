-- Cleanup walks the bucket tables by block ranges instead of an index on
-- expires_at. A check of a key idle for a while moves its expires_at (the
-- bucket was full, now it is not), and an update that changes an indexed
-- column is never HOT: with many keys each checked rarely, almost every
-- check wrote a new row version and two index entries. Without the index,
-- updates stay HOT as long as the page has room (fillfactor 80), also then.
-- See README, "Cleanup".

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS pgratelimit_buckets_expires_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS pgratelimit_ephemeral_buckets_expires_at_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgratelimit_buckets_expires_at_idx
    ON pgratelimit_buckets (expires_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgratelimit_ephemeral_buckets_expires_at_idx
    ON pgratelimit_ephemeral_buckets (expires_at);

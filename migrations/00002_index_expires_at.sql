-- An index for cleanup, which deletes rows in expires_at order. expires_at is
-- rounded up to the minute and only ever moves forward, and a new row is
-- inserted with the expiry its first check computes, so most updates leave it
-- unchanged and stay HOT (see README, "Cleanup").

-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgratelimit_buckets_expires_at_idx
    ON pgratelimit_buckets (expires_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgratelimit_ephemeral_buckets_expires_at_idx
    ON pgratelimit_ephemeral_buckets (expires_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS pgratelimit_ephemeral_buckets_expires_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS pgratelimit_buckets_expires_at_idx;

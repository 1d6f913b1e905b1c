-- The per-check transaction, one statement per round trip (5 round trips per check):
-- a token bucket written plainly in SQL. TBL is replaced by bench_logged or
-- bench_unlogged; the bucket (2^40 tokens) never runs out, so every UPDATE runs.
-- expires_at moves like pgratelimit's: rounded to the minute and only forward, so the
-- UPDATE stays HOT despite the index on it.
\set k random(1, :keys)
BEGIN;
INSERT INTO TBL (prefix, key, tokens, refilled_at, expires_at)
    VALUES ('bench', 'key-' || :k, 1099511627776, now(), date_trunc('minute', now()) + interval '1 hour')
    ON CONFLICT (prefix, key) DO NOTHING;
SELECT tokens, refilled_at, expires_at, clock_timestamp() FROM TBL
    WHERE prefix = 'bench' AND key = 'key-' || :k FOR UPDATE;
UPDATE TBL SET tokens = tokens - 1, refilled_at = now(),
    expires_at = greatest(expires_at, date_trunc('minute', now()) + interval '1 hour')
    WHERE prefix = 'bench' AND key = 'key-' || :k;
COMMIT;

-- The same per-check transaction as tx.sql, sent the way pgratelimit's per-check path
-- sends it: BEGIN, INSERT and SELECT ... FOR UPDATE pipelined in one round trip, UPDATE
-- and COMMIT in a second. The floor for one check per transaction, without a Go client.
\set k random(1, :keys)
\startpipeline
BEGIN;
INSERT INTO TBL (prefix, key, tokens, refilled_at, expires_at)
    VALUES ('bench', 'key-' || :k, 1099511627776, now(), date_trunc('minute', now()) + interval '1 hour')
    ON CONFLICT (prefix, key) DO NOTHING;
SELECT tokens, refilled_at, expires_at, clock_timestamp() FROM TBL
    WHERE prefix = 'bench' AND key = 'key-' || :k FOR UPDATE;
\endpipeline
\startpipeline
UPDATE TBL SET tokens = tokens - 1, refilled_at = now(),
    expires_at = greatest(expires_at, date_trunc('minute', now()) + interval '1 hour')
    WHERE prefix = 'bench' AND key = 'key-' || :k;
COMMIT;
\endpipeline

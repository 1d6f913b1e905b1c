-- One statement per check, in autocommit: insert the bucket or take a token from it,
-- returning what is left. One round trip and one commit per check: the cheapest write
-- a check can be (and the shape rate-limiter-flexible uses), but the decision is made
-- in SQL with no room for the caller's logic between reading and writing.
\set k random(1, :keys)
INSERT INTO TBL AS b (prefix, key, tokens, refilled_at, expires_at)
    VALUES ('bench', 'key-' || :k, 1099511627775, now(), date_trunc('minute', now()) + interval '1 hour')
    ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens - 1, refilled_at = now(),
        expires_at = greatest(b.expires_at, date_trunc('minute', now()) + interval '1 hour')
    WHERE b.tokens >= 1
    RETURNING tokens;

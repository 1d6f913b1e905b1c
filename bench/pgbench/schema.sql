-- Tables for the plain-SQL baselines and for rate-limiter-flexible, created once in the
-- throwaway database. bench_* copy pgratelimit's own bucket table (migrations/00001 and
-- 00002: the same columns, collation, fillfactor and expires_at index), so the baselines
-- write the same rows pgratelimit writes; rlf_* is the table RateLimiterPostgres creates
-- for itself (_getCreateTableStmt), here also as UNLOGGED for the unlogged scenarios.
CREATE TABLE bench_logged (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    tokens      bigint           NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key)
) WITH (fillfactor = 80);
CREATE INDEX ON bench_logged (expires_at);

CREATE UNLOGGED TABLE bench_unlogged (
    prefix      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    tokens      bigint           NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz      NOT NULL,
    expires_at  timestamptz      NOT NULL,
    PRIMARY KEY (prefix, key)
) WITH (fillfactor = 80);
CREATE INDEX ON bench_unlogged (expires_at);

CREATE TABLE rlf_logged (key varchar(255) PRIMARY KEY, points integer NOT NULL DEFAULT 0, expire bigint);
CREATE UNLOGGED TABLE rlf_unlogged (key varchar(255) PRIMARY KEY, points integer NOT NULL DEFAULT 0, expire bigint);

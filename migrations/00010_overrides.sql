-- Limits as data: per-key overrides and the policies limiters run.
--
-- pgratelimit_overrides holds a key's override of its limiter's Capacity
-- and Refill (Limiter.SetOverride), until a time (NULL: no end), with a
-- note for operators. A limiter with Config.Overrides reads it in the
-- statement that locks the key's bucket row, through pgratelimit_override:
-- a VOLATILE function, so that it reads with a snapshot taken after the
-- lock (a plain join would read the statement's snapshot, taken before the
-- lock was waited for, and miss an override committed meanwhile). Every
-- writer of a key's override holds the key's bucket row, so the row needs
-- no lock of its own. An override past its end reads as missing (the
-- check's clock judges it); cleanup may delete it.
--
-- pgratelimit_policies records the policies limiters run, one row per
-- prefix and distinct policy, with when a process first and last started
-- running it: what tools (the CLI, the operator UI) show a key under, and
-- how they see two instances disagree. schedule is "every <Go duration>"
-- or the calendar ("calendar <every> <location>", anchor aside); features
-- the limiter's options that change what a key holds, comma-separated.
--
-- On Citus pgratelimit_overrides is distributed by key, colocated with the
-- buckets (migrations.Distribute); the coordinator reads it in a statement
-- of its own after each lock. pgratelimit_policies stays on the
-- coordinator.

-- +goose Up
CREATE TABLE pgratelimit_overrides (
    prefix     text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    capacity   bigint           NOT NULL CHECK (capacity > 0),
    refill     bigint           NOT NULL CHECK (refill > 0),
    until      timestamptz,
    note       text             NOT NULL DEFAULT '',
    updated_at timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, key)
);

-- +goose StatementBegin
CREATE FUNCTION pgratelimit_override(p text, k text)
RETURNS TABLE (capacity bigint, refill bigint, until timestamptz)
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
BEGIN
    RETURN QUERY SELECT o.capacity, o.refill, o.until FROM pgratelimit_overrides o WHERE o.prefix = p AND o.key = k;
END
$$;
-- +goose StatementEnd

CREATE TABLE pgratelimit_policies (
    prefix     text COLLATE "C" NOT NULL,
    storage    text             NOT NULL,
    capacity   bigint           NOT NULL,
    refill     bigint           NOT NULL,
    schedule   text             NOT NULL,
    features   text             NOT NULL,
    first_seen timestamptz      NOT NULL DEFAULT now(),
    last_seen  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, storage, capacity, refill, schedule, features)
);

-- +goose Down
DROP TABLE pgratelimit_policies;
DROP FUNCTION pgratelimit_override(text, text);
DROP TABLE pgratelimit_overrides;

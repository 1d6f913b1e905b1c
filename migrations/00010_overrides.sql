-- Limits as data: per-key overrides and the policies limiters run.
--
-- pgratelimit_overrides holds a key's override of its limiter's Capacity
-- and Refill (Limiter.SetOverride), until a time (NULL: no end), with a
-- note for operators: the source of truth, which tools list. A check reads
-- it from the key's bucket row instead, which carries a copy in ov_capacity,
-- ov_refill and ov_until: ov_capacity NULL, no override; > 0, the override;
-- -1 (the default), unknown. The statement that locks the row returns the
-- copy as of the lock (under READ COMMITTED, FOR UPDATE returns the newest
-- committed version of the row it locked), and for a row whose copy is
-- unknown the override that pgratelimit_override reads: a VOLATILE
-- function, so that it reads with a snapshot taken after the lock (a plain
-- join would read the statement's snapshot, taken before the lock was
-- waited for, and miss an override committed meanwhile), called for
-- unknown rows only (in a CASE of the lock's select list: no join, which
-- cost every row). It returns the override as text, '' for none, else
-- capacity, refill and until (microseconds since the epoch, or '-' for no
-- end) separated by spaces: one value, read in one snapshot, that every
-- driver scans. A check of a limiter with Config.Overrides that writes
-- the row writes the copy it resolved, so the row is known from then on.
-- SetOverride and ClearOverride write the table and the copy in one
-- transaction, under the row's lock, in both bucket tables (limiters of
-- either storage may share the prefix). A new row (a key first checked, or
-- a row that cleanup or Reset deleted, or a crash emptied from the unlogged
-- table) and every row written before this migration is unknown. An
-- override past its end reads as missing (the check's clock judges it).
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
-- of its own after each lock (the rows' copies are written there too, and
-- not read; the function is not called there). pgratelimit_policies stays
-- on the coordinator.

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

ALTER TABLE pgratelimit_buckets ADD COLUMN ov_capacity bigint DEFAULT -1, ADD COLUMN ov_refill bigint, ADD COLUMN ov_until timestamptz;
ALTER TABLE pgratelimit_ephemeral_buckets ADD COLUMN ov_capacity bigint DEFAULT -1, ADD COLUMN ov_refill bigint, ADD COLUMN ov_until timestamptz;

-- +goose StatementBegin
CREATE FUNCTION pgratelimit_override(p text, k text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r text;
BEGIN
    SELECT o.capacity || ' ' || o.refill || ' ' || COALESCE((extract(epoch FROM o.until) * 1000000)::bigint::text, '-')
    INTO r FROM pgratelimit_overrides o WHERE o.prefix = p AND o.key = k;
    RETURN COALESCE(r, '');
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
ALTER TABLE pgratelimit_ephemeral_buckets DROP COLUMN ov_capacity, DROP COLUMN ov_refill, DROP COLUMN ov_until;
ALTER TABLE pgratelimit_buckets DROP COLUMN ov_capacity, DROP COLUMN ov_refill, DROP COLUMN ov_until;
DROP TABLE pgratelimit_overrides;

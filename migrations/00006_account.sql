-- One account per key: what pgratelimit needs to keep a key's balance exact
-- in every combination of grants, debts, refunds, request IDs and plans.
--
-- Buckets remember the Capacity they were last written with, so that a check
-- under another Capacity (a plan change) can add the difference at once, or
-- clamp to a smaller one (NULL: written by an older release; no change).
--
-- A grant made by a limiter with a ledger is marked: once it expires with
-- credits left, cleanup leaves it until an operation on its key has written
-- the 'expire' ledger row (and set its amount to 0).
--
-- A request row now names what its ID did (kind: charge, debit, refund,
-- grant) and, in detail (JSON), its whole first outcome, where a charge took
-- its credits from (so that a settlement gives them back there) and its
-- settlement. A row past expires_at reads as missing, so cleanup changes
-- nothing, and its ID names a new request.
--
-- Ledger rows say which part of amount went to or came from grants, and the
-- grants' part of the balance afterwards; 'expire' records the credits of a
-- grant that expired, 'plan' what a change of plan did.

-- +goose Up
ALTER TABLE pgratelimit_buckets ADD COLUMN capacity bigint;
ALTER TABLE pgratelimit_ephemeral_buckets ADD COLUMN capacity bigint;
ALTER TABLE pgratelimit_grants ADD COLUMN ledger boolean NOT NULL DEFAULT false;
ALTER TABLE pgratelimit_requests ADD COLUMN kind text NOT NULL DEFAULT 'charge',
    ADD COLUMN detail text;
ALTER TABLE pgratelimit_ledger ADD COLUMN grants_amount bigint NOT NULL DEFAULT 0,
    ADD COLUMN granted bigint;
ALTER TABLE pgratelimit_ledger DROP CONSTRAINT pgratelimit_ledger_kind_check;
ALTER TABLE pgratelimit_ledger ADD CONSTRAINT pgratelimit_ledger_kind_check
    CHECK (kind IN ('charge', 'refund', 'grant', 'settle', 'debit', 'reset', 'expire', 'plan'));

-- +goose Down
DELETE FROM pgratelimit_ledger WHERE kind IN ('expire', 'plan');
DELETE FROM pgratelimit_requests WHERE kind NOT IN ('charge', 'debit');
ALTER TABLE pgratelimit_ledger DROP CONSTRAINT pgratelimit_ledger_kind_check;
ALTER TABLE pgratelimit_ledger ADD CONSTRAINT pgratelimit_ledger_kind_check
    CHECK (kind IN ('charge', 'refund', 'grant', 'settle', 'debit', 'reset'));
ALTER TABLE pgratelimit_ledger DROP COLUMN granted, DROP COLUMN grants_amount;
ALTER TABLE pgratelimit_requests DROP COLUMN detail, DROP COLUMN kind;
ALTER TABLE pgratelimit_grants DROP COLUMN ledger;
ALTER TABLE pgratelimit_ephemeral_buckets DROP COLUMN capacity;
ALTER TABLE pgratelimit_buckets DROP COLUMN capacity;

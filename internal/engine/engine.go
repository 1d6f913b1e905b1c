// Package engine runs pgratelimit's transactions: one shape for every
// operation on buckets (a check, an AllowAll, a coalesced batch, a refund, a
// grant, ...), in a transaction of its own or in the caller's:
//
//	BEGIN                                           -- own transactions only
//	INSERT ... ON CONFLICT (prefix, key) DO NOTHING -- every row, per table
//	SELECT ... FOR UPDATE                           -- in (prefix, key) order, and the clock after the locks
//	-- every request decided by the account model, in order, each all or nothing
//	UPDATE ...                                      -- the rows that changed, and what else the decisions write
//	COMMIT                                          -- own transactions only
//
// pipelined into two round trips. Rows are locked in one global order (table,
// prefix, key), so no two transactions of ours can deadlock.
//
// A Plan is such a transaction, fixed before it runs (plan.go); an attempt is
// one try of it; the runner (run.go) sends an attempt's statements, which
// its Shape (shape.go) builds in the Dialect's words from the SQL of
// internal/sqlgen; decide.go applies the account model (internal/account)
// to what the locks read, and records.go keeps request IDs' records. The
// engine reaches the database through an Executor (a pool connection, the
// caller's pgx.Tx or *sql.Tx).
package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Errors the engine maps database errors to, whatever the driver. The root
// package returns them as its own.
var (
	// ErrNotMigrated: the tables are missing.
	ErrNotMigrated = errors.New("pgratelimit: tables not found; run the migrations (migrations.Up or 'pgratelimit migrate up')")
	// ErrLockTimeout: a row lock was not had within lock_timeout.
	ErrLockTimeout = errors.New("pgratelimit: timed out waiting for the bucket's row lock (Config.LockTimeout)")
	// ErrInvalidConfig: a setting out of range, or (Attempt.shared) a
	// Prefix and Storage shared by a limiter and a semaphore.
	ErrInvalidConfig = errors.New("pgratelimit: invalid config")
)

// Storage is a bucket table: durable (logged) or ephemeral (unlogged).
type Storage int8

// The bucket tables.
const (
	Durable Storage = iota
	Ephemeral
)

// Statements are the statements of s's table.
func (s Storage) Statements() *sqlgen.Statements {
	if s == Ephemeral {
		return &sqlgen.Ephemeral
	}
	return &sqlgen.Durable
}

// Other is the other bucket table.
func (s Storage) Other() Storage {
	if s == Ephemeral {
		return Durable
	}
	return Ephemeral
}

// MaxKeyLen is the longest key, MaxPrefixLen the longest prefix, and
// MaxRequestIDLen the longest request or lease ID, in bytes.
const (
	MaxKeyLen       = 1024
	MaxPrefixLen    = 256
	MaxRequestIDLen = 256
)

// Row identifies a bucket: its table and primary key.
type Row struct {
	Storage     Storage
	Prefix, Key string
}

// CompareRows orders rows as they are locked: by table, prefix and key, in
// byte order (as the tables' COLLATE "C").
func CompareRows(a, b Row) int {
	if a.Storage != b.Storage {
		return int(a.Storage) - int(b.Storage)
	}
	if c := strings.Compare(a.Prefix, b.Prefix); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// Charge is what a request does to one bucket: the costs of every charge of
// the call on that bucket added up, decided by the first one's policy.
type Charge struct {
	Row    Row
	Policy account.Policy
	Cost   int64
	// Overrides says the key's override, while live, replaces Policy's
	// Capacity and Refill (Config.Overrides): the locks read it.
	Overrides bool
	// Part, when set, decides the charge instead of the account model: the
	// row is then only the key's lock (see Part).
	Part Part
	// Call is what Part needs of this charge's call beyond the charge (a
	// lease's ID, and where its outcome goes): one Part value serves the
	// charges of many calls, so that a batch decides them together.
	Call any
	// NoInsert says a coalesced batch need not insert the charge's row: a
	// missing row defers the request like a row another transaction holds,
	// and the request runs again waiting for its locks, with the INSERT.
	// For a lease's release or extension (a key without a row has no
	// lease), and an acquisition on a key whose row its semaphore has seen.
	NoInsert bool
	// Observer, when set, watches the charge as it is decided.
	Observer Observer
}

// Override is a key's override of its limiter's Capacity and Refill.
type Override struct {
	Capacity, Refill int64
	Until            time.Time // zero: no end
	Note             string
}

// Live says o applies at now: it is one (Capacity > 0) and has not ended.
func (o Override) Live(now time.Time) bool {
	return o.Capacity > 0 && (o.Until.IsZero() || now.Before(o.Until))
}

// Policy is p under o: o's Capacity and Refill, p's schedule.
func (o Override) Policy(p account.Policy) account.Policy {
	p.Capacity, p.Refill = o.Capacity, o.Refill
	return p
}

// Request is one call: one or more charges decided together, all or
// nothing, and its outcome.
type Request struct {
	Ctx     context.Context
	Charges []Charge // one per distinct bucket
	Kind    account.Kind
	ID      string    // the request ID; "" for none
	Actual  int64     // OpSettle: the actual cost
	Expires time.Time // OpGrant: the grant's expiry (zero: never)
	// Override is OpPlan's: the override to set on the request's one
	// charge, whose plan changes to it at once; nil clears the key's
	// override (the charge's Policy applies again from the next operation
	// that locks its row).
	Override *Override

	// The outcome, once decided (Outcomes not nil) or failed (Err).
	Allowed  bool
	Outcomes []Outcome // one per charge
	Err      error
	Grant    account.Grant // OpGrant: the grant made
}

// Outcome is what a request did on one of its charges: the account model's
// outcome, and what else the model said of it.
type Outcome struct {
	account.Outcome
	// Replayed says the charge was answered from its request ID's record
	// (account.Change.Replayed): nothing changed.
	Replayed bool
}

// BucketsOnly says q reads and writes bucket rows alone: a charge without
// a request ID whose charges have no grants, ledger, overrides, lease part
// or observer, all of which live in tables of their own. Only such a
// request can run on the Citus node of its rows' shards (OnShards).
func (q *Request) BucketsOnly() bool {
	if q.Kind != account.OpCharge || q.ID != "" {
		return false
	}
	for _, c := range q.Charges {
		if c.Policy.Grants || c.Policy.Ledger || c.Overrides || c.Part != nil || c.Observer != nil {
			return false
		}
	}
	return true
}

// Rows returns the request's distinct rows.
func (q *Request) Rows() []Row {
	rs := make([]Row, len(q.Charges))
	for i, c := range q.Charges {
		rs[i] = c.Row
	}
	return rs
}

// Decided says the engine decided q (it was not skipped: its context ended
// before its transaction decided it).
func (q *Request) Decided() bool { return q.Outcomes != nil }

// LockMode says what a transaction does about row locks that other
// transactions hold.
type LockMode int8

const (
	// WaitLocks waits for every row lock: a check run alone, a lane of
	// parked checks, a check in the caller's transaction.
	WaitLocks LockMode = iota
	// SkipLocked skips rows that another transaction holds (SKIP LOCKED):
	// the requests that need them are deferred (a coalesced batch). Its
	// INSERT waits at most InsertGuard for another transaction's new row.
	SkipLocked
	// SkipLockedNoInsert is SkipLocked without the INSERT, for a batch whose
	// INSERT waited past InsertGuard: missing rows are deferred like held
	// ones.
	SkipLockedNoInsert
)

// InsertGuard bounds how long a coalesced batch's INSERT may wait for
// another transaction that inserted one of its keys and has not committed
// (an AllowNTx in a long transaction, say). Past it the batch runs again
// without the INSERT (SkipLockedNoInsert), and the checks of missing rows
// wait on their own rows.
const InsertGuard = 20 * time.Millisecond

// Settings are what the requests of one transaction must share: the
// database's dialect, the clock and the transaction settings of their
// limiters. Comparable: coalesced batches hold requests of equal settings.
type Settings struct {
	Dialect     Dialect
	Clock       *Clock // nil: the database's
	LockTimeout time.Duration
	Async       bool
}

// Clock is a Config.Clock, by pointer so that settings compare.
type Clock struct{ Now func() time.Time }

// Param is the clock parameter of the statements: nil for the database's
// clock, else the time truncated to PostgreSQL's microseconds.
func (c *Clock) Param() any {
	if c == nil {
		return nil
	}
	return c.Now().Truncate(time.Microsecond).UTC()
}

// DBError maps a database error: a missing table becomes ErrNotMigrated and
// a lock timeout ErrLockTimeout (both still wrapping the original), whatever
// the driver; everything else is wrapped with what was being done.
func DBError(op string, err error) error {
	switch SQLState(err) {
	case pgerrcode.UndefinedTable:
		return fmt.Errorf("%w: %s: %w", ErrNotMigrated, op, err)
	case pgerrcode.LockNotAvailable:
		return fmt.Errorf("%w: %s: %w", ErrLockTimeout, op, err)
	}
	return fmt.Errorf("pgratelimit: %s: %w", op, err)
}

// SQLState is the SQLSTATE of a database error, or "": pgx's
// *pgconn.PgError, lib/pq's *pq.Error and other database/sql drivers'
// errors all have a SQLState method.
func SQLState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

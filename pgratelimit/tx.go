package pgratelimit

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/citus"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Tx is the caller's own transaction, from pgx (PgxTx) or database/sql
// (SQLTx, any PostgreSQL driver), for Limiter.In: the one way to run any
// operation in it.
type Tx struct{ ex engine.Executor }

// PgxTx is tx as a Tx.
func PgxTx(tx pgx.Tx) Tx {
	if tx == nil {
		return Tx{}
	}
	return Tx{engine.PgxExecutor{Q: tx}}
}

// SQLTx is tx, a database/sql transaction of any PostgreSQL driver (pgx's
// stdlib, lib/pq, ...), as a Tx. GORM exposes its *sql.Tx as
// db.Begin().Statement.ConnPool.(*sql.Tx), bun as bun.Tx.Tx, and sqlc code
// takes the *sql.Tx you begin yourself.
func SQLTx(tx *sql.Tx) Tx {
	if tx == nil {
		return Tx{}
	}
	return Tx{engine.SQLExecutor{Tx: tx}}
}

// In returns l running every operation in tx, the caller's own transaction:
// AllowN, Allow, Wait, Refund, Debit, Settle, Grant, Reset, and the reads
// Peek, Grants and Ledger. What they write is written only if tx commits, so a
// service charges credits atomically with its own write (and a rollback
// gives them back), and a purchase and its grant commit together. They send
// the same statements as without tx, one row per statement, without BEGIN
// and COMMIT, never coalesced, never denied by the deny cache; tx's
// isolation and lock_timeout apply (Config.LockTimeout and AsyncCommit do
// not).
//
// The rows they lock stay locked until tx ends, so other operations on the
// same keys wait for it (those of other keys do not): keep such
// transactions short. Under REPEATABLE READ or SERIALIZABLE a concurrent
// check of the same key makes one fail with a serialization error (SQLSTATE
// 40001); retry the transaction as for any other. On an error the
// transaction is in a failed state: roll it back. A zero Tx (a nil
// transaction) makes every operation ErrInvalidArgument. To charge several
// limits at once in tx, use Tx.AllowAll. The returned limiter
// costs a copy of l: make one per transaction.
func (l *Limiter) In(tx Tx) *Limiter {
	c := *l
	c.tx = &tx
	return &c
}

// AllowAll is the package's AllowAll run in tx, the caller's own
// transaction, as In runs a limiter's operations: the charges' buckets are
// taken from only if tx commits, their rows stay locked until it ends, and
// tx's isolation and lock_timeout apply. The charges' limiters and
// semaphores must use tx's database and must not be bound to another
// transaction by In (ErrInvalidArgument).
func (tx Tx) AllowAll(ctx context.Context, charges ...Charge) (MultiResult, error) {
	if tx.ex == nil {
		return MultiResult{}, badArg(ErrInvalidArgument, "tx is nil: pass PgxTx or SQLTx of an open transaction")
	}
	return allowAll(ctx, &tx, charges)
}

// runIn runs q in the caller's transaction tx through c: tx's isolation and
// lock_timeout, one row per statement whatever the dialect (Citus takes
// them too; see txDialect). what names it in errors.
func (c *Client) runIn(ctx context.Context, tx *Tx, q *engine.Request, set engine.Settings, what string) error {
	if c.mem != nil {
		return errMemoryTx
	}
	if tx.ex == nil {
		return badArg(ErrInvalidArgument, "tx is nil: pass PgxTx or SQLTx of an open transaction")
	}
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.leave()
	d, err := c.txDialect(ctx, tx)
	if err != nil {
		return engine.DBError(what+" in transaction", err)
	}
	set.Dialect = d
	if err := engine.RunIn(ctx, tx.ex, engine.NewPlan([]*engine.Request{q}, set, false, engine.WaitLocks)); err != nil {
		return engine.DBError(what+" in transaction", err)
	}
	return q.Result()
}

// txDialect is the dialect of c's checks in the caller's transactions:
// the client's if known, else the one the first such transaction found,
// asked through it (two catalog reads, once), never through c's pool, of
// which the caller's transaction may hold the last connection. Both
// matter: Citus refuses some of plain PostgreSQL's statements (the grants'
// lateral join), and reads overrides in statements of its own.
func (c *Client) txDialect(ctx context.Context, tx *Tx) (engine.Dialect, error) {
	if d := c.dia.Load(); d != nil {
		return *d, nil
	}
	if d := c.txDia.Load(); d != nil {
		return *d, nil
	}
	d, err := citus.Detect(ctx, tx.ex)
	if err != nil {
		return nil, err
	}
	c.txDia.Store(&d)
	return d, nil
}

// read runs reads in the caller's transaction tx, else (nil) on c's pool.
func (c *Client) read(ctx context.Context, tx *Tx, what string, stmts ...engine.Stmt) error {
	if c.mem != nil {
		return errMemoryTx // the callers read memory themselves, outside a transaction
	}
	ex := engine.Executor(engine.PgxExecutor{Q: c.pool})
	if tx != nil {
		if ex = tx.ex; ex == nil {
			return badArg(ErrInvalidArgument, "tx is nil: pass PgxTx or SQLTx of an open transaction")
		}
	}
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.leave()
	if err := ex.Pipeline(ctx, stmts); err != nil {
		return engine.DBError(what, err)
	}
	return nil
}

// run runs q as l's operation: in l's transaction (In), else in one of the
// client's, coalesced when coalesce. seen is told a coalesced batch's size.
func (l *Limiter) run(q *engine.Request, set engine.Settings, coalesce bool, what string) error {
	l.notePolicy(q.Ctx, l.tx != nil)
	if l.tx != nil {
		return l.client.runIn(q.Ctx, l.tx, q, set, what)
	}
	return l.client.run(q, set, l.metrics.seen, coalesce, what)
}

// errMemoryTx is the error of an operation in a transaction (In) of a
// limiter of NewMemoryClient.
var errMemoryTx = badArg(ErrInvalidArgument, "a limiter of NewMemoryClient runs in no transaction (In): it has no database")

// load reads key's account and the check's clock: from l's transaction or
// pool with stmts, or from the memory of a NewMemoryClient.
func (l *Limiter) load(ctx context.Context, key, what string, stmts func(*account.State, *time.Time) []engine.Stmt) (account.State, time.Time, error) {
	var (
		st  account.State
		now time.Time
	)
	if m := l.client.mem; m != nil {
		if l.tx != nil {
			return st, now, errMemoryTx
		}
		st, now = m.Read(l.row(key), l.settings())
		return st, now, nil
	}
	err := l.client.read(ctx, l.tx, what, stmts(&st, &now)...)
	return st, now, err
}

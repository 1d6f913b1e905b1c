package pgratelimit

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// AllowNTx is AllowN inside the caller's transaction tx: the tokens are spent
// only if tx commits, so a service can charge credits atomically with its own
// write (and a rollback gives them back). It sends the same statements as
// AllowN, without BEGIN and COMMIT, and never coalesces.
//
// The bucket's row stays locked until tx ends, so other checks of the same key
// wait for it (checks of other keys do not): keep such transactions short.
// Under REPEATABLE READ or SERIALIZABLE a concurrent check of the same key
// makes this one fail with a serialization error (SQLSTATE 40001); retry the
// transaction as for any other. On an error the transaction is in a failed
// state: roll it back.
func (l *Limiter) AllowNTx(ctx context.Context, tx pgx.Tx, key string, cost int64) (Result, error) {
	var ex engine.Executor
	if tx != nil {
		ex = engine.PgxExecutor{Q: tx}
	}
	return l.allowInTx(ctx, ex, key, cost)
}

// AllowNSQLTx is AllowNTx for a database/sql transaction, with any
// PostgreSQL driver (pgx's stdlib, lib/pq, ...): the same statements in tx,
// spent only if tx commits, the row lock held until then. GORM exposes its
// *sql.Tx as db.Begin().Statement.ConnPool.(*sql.Tx), bun as bun.Tx.Tx, and
// sqlc code takes the *sql.Tx you begin yourself.
func (l *Limiter) AllowNSQLTx(ctx context.Context, tx *sql.Tx, key string, cost int64) (Result, error) {
	var ex engine.Executor
	if tx != nil {
		ex = engine.SQLExecutor{Tx: tx}
	}
	return l.allowInTx(ctx, ex, key, cost)
}

func (l *Limiter) allowInTx(ctx context.Context, ex engine.Executor, key string, cost int64) (Result, error) {
	m, err := allowAllIn(ctx, ex, "check "+quoteKey(key)+" in transaction", Charge{Limiter: l, Key: key, Cost: cost})
	if err != nil {
		return Result{}, err
	}
	return m.Results[0], nil
}

// AllowAllTx is AllowAll inside the caller's transaction tx: every charge is
// spent only if tx commits. The rows stay locked until tx ends; see AllowNTx.
func AllowAllTx(ctx context.Context, tx pgx.Tx, charges ...Charge) (MultiResult, error) {
	var ex engine.Executor
	if tx != nil {
		ex = engine.PgxExecutor{Q: tx}
	}
	return allowAllIn(ctx, ex, "AllowAll in transaction", charges...)
}

// AllowAllSQLTx is AllowAllTx for a database/sql transaction (see
// AllowNSQLTx).
func AllowAllSQLTx(ctx context.Context, tx *sql.Tx, charges ...Charge) (MultiResult, error) {
	var ex engine.Executor
	if tx != nil {
		ex = engine.SQLExecutor{Tx: tx}
	}
	return allowAllIn(ctx, ex, "AllowAll in transaction", charges...)
}

// allowAllIn runs the charges in the caller's transaction.
func allowAllIn(ctx context.Context, ex engine.Executor, what string, charges ...Charge) (MultiResult, error) {
	start := time.Now()
	cl, first, err := newCall(ctx, charges)
	if err != nil {
		recordInvalid(ctx, start, charges)
		return MultiResult{}, err
	}
	var m MultiResult
	err = first.runIn(ctx, ex, cl.q, settingsOf(charges), what)
	if err == nil {
		m = cl.result()
	}
	record(ctx, start, m, err, charges)
	return m, err
}

// runIn runs q in the caller's transaction on ex with the settings set:
// its isolation, its lock_timeout, one row per statement whatever the
// dialect. what names it in errors.
func (l *Limiter) runIn(ctx context.Context, ex engine.Executor, q *engine.Request, set engine.Settings, what string) error {
	if ex == nil {
		return fmt.Errorf("%w: tx is nil", ErrInvalidConfig)
	}
	if !l.client.gate.enter() {
		return ErrClosed
	}
	defer l.client.gate.leave()
	set.Dialect = engine.Postgres{} // one row per statement, as Citus takes them too
	if known := l.client.dia.Load(); known != nil {
		set.Dialect = *known
	}
	if err := engine.RunIn(ctx, ex, engine.NewPlan([]*engine.Request{q}, set, false, engine.WaitLocks)); err != nil {
		return engine.DBError(what, err)
	}
	return q.Result()
}

package pgratelimit

import (
	"context"

	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// run runs q as s's operation: in s's transaction (In), else in one of the
// client's, coalesced unless disabled. what names it in errors (made only
// when they can say it: a coalesced batch's errors name no call).
func (s *Semaphore) run(q *engine.Request, what func() string) error {
	set := s.settings()
	switch {
	case s.tx != nil:
		return runInTx(s.client, q.Ctx, s.tx.ex, q, set, what())
	case s.cfg.DisableCoalescing:
		return s.client.run(q, set, nil, false, what())
	}
	return s.client.run(q, set, nil, true, "")
}

// runInTx runs q in the caller's transaction on ex through c, as
// Limiter.runIn does.
func runInTx(c *Client, ctx context.Context, ex engine.Executor, q *engine.Request, set engine.Settings, what string) error {
	if ex == nil {
		return badArg(ErrInvalidArgument, "tx is nil: pass PgxTx or SQLTx of an open transaction")
	}
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.leave()
	set.Dialect = engine.Postgres{} // one row per statement, as Citus takes them too
	if known := c.dia.Load(); known != nil {
		set.Dialect = *known
	}
	if err := engine.RunIn(ctx, ex, engine.NewPlan([]*engine.Request{q}, set, false, engine.WaitLocks)); err != nil {
		return engine.DBError(what+" in transaction", err)
	}
	return q.Result()
}

// read runs reads of s's: in s's transaction (In), else on the pool.
func (s *Semaphore) read(ctx context.Context, what string, stmts ...engine.Stmt) error {
	ex := engine.Executor(engine.PgxExecutor{Q: s.client.pool})
	if s.tx != nil {
		if ex = s.tx.ex; ex == nil {
			return badArg(ErrInvalidArgument, "tx is nil: pass PgxTx or SQLTx of an open transaction")
		}
	}
	if !s.client.gate.enter() {
		return ErrClosed
	}
	defer s.client.gate.leave()
	if err := ex.Pipeline(ctx, stmts); err != nil {
		return engine.DBError(what, err)
	}
	return nil
}

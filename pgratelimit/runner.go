package pgratelimit

import (
	"context"
	"database/sql"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The runner sends a plan's statements: in a transaction of its own on a
// pool connection (runOwn, runChain), or in the caller's transaction (runIn).

// stmt is one statement and, for one that returns rows, how to read them.
type stmt struct {
	sql  string
	args []any
	scan func(rowScanner) error // nil for statements that return no rows
}

// rowScanner is what pgx.Rows and *sql.Rows have in common.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// executor sends statements to the database: pipelined in one round trip on
// pgx, one after another on database/sql.
type executor interface {
	pipeline(ctx context.Context, stmts []stmt) error
}

// runIn runs p (not own) in the caller's transaction on ex: its isolation,
// its lock_timeout, no retries (a failed statement fails the caller's
// transaction).
func runIn(ctx context.Context, ex executor, p *plan) error {
	a := p.attempt(ctx, p.mode)
	if err := ex.pipeline(ctx, a.open()); err != nil {
		return err
	}
	if _, err := a.decideAll(ex); err != nil {
		return err
	}
	return ex.pipeline(ctx, a.close())
}

// chain supplies the transactions that follow one another on a connection
// (see runChain), and is told how each one ended.
type chain interface {
	// next returns the plan to run after the one just decided (which
	// deferred deferred) and the context to run it in, or nil.
	next(after *plan, deferred []*request) (*plan, context.Context)
	// done is called once per plan, when it has committed (err nil) or
	// failed.
	done(p *plan, deferred []*request, err error)
}

// runOwn runs p in a transaction of its own on a connection of pool and
// returns the requests it deferred.
func runOwn(ctx context.Context, pool *pgxpool.Pool, p *plan) (deferred []*request, err error) {
	var one single
	runChain(ctx, pool, p, &one)
	return one.deferred, one.err
}

// single is the chain of one plan.
type single struct {
	deferred []*request
	err      error
}

func (*single) next(*plan, []*request) (*plan, context.Context) { return nil, nil }
func (s *single) done(_ *plan, deferred []*request, err error)  { s.deferred, s.err = deferred, err }

// runChain runs own transactions one after another on one connection of
// pool: first, then each plan ch.next returns once the one before it is
// decided, until it returns none. The statements that end one (UPDATE,
// COMMIT) and those that begin the next (BEGIN, INSERT, SELECT) go in one
// round trip, so while the chain lasts a transaction costs the wire one
// round trip, not two. The next transaction may share rows with the one
// before it: it locks them after that one's COMMIT.
//
// A transaction that fails before it commits with an error that trying again
// can cure (retryMode) is tried again on the connection, up to maxTries,
// while no other follows it; a COMMIT the server confirmed is a commit, even
// if the connection fails right after.
func runChain(ctx context.Context, pool *pgxpool.Pool, first *plan, ch chain) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		ch.done(first, nil, err)
		return
	}
	defer conn.Release()
	ex := pgxExecutor{conn}
	cur, try, opened := first.attempt(ctx, first.mode), 1, false
	// fail rolls back cur after err and readies its next try, or reports
	// err and says to stop.
	fail := func(err error) bool {
		rollback(cur.ctx, conn)
		mode, again := retryMode(conn, err, cur.mode, try)
		if !again {
			ch.done(cur.plan, nil, err)
			return false
		}
		cur, try, opened = cur.plan.attempt(cur.ctx, mode), try+1, false
		return true
	}
	for {
		if !opened {
			if _, err := ex.pipelineAt(cur.ctx, cur.open()); err != nil {
				if !fail(err) {
					return
				}
				continue
			}
			opened = true
		}
		deferred, err := cur.decideAll(ex)
		if err != nil {
			if !fail(err) {
				return
			}
			continue
		}
		closing := cur.close()
		nxt, nctx := ch.next(cur.plan, deferred)
		if nxt == nil {
			if at, err := ex.pipelineAt(cur.ctx, closing); err != nil && at < len(closing) {
				if !fail(err) {
					return
				}
				continue
			}
			ch.done(cur.plan, deferred, nil)
			return
		}
		next := nxt.attempt(nctx, nxt.mode)
		both, cancel := followAll(cur.ctx, nctx)
		at, err := ex.pipelineAt(both, append(closing, next.open()...))
		cancel()
		switch {
		case err == nil:
			ch.done(cur.plan, deferred, nil)
			cur, try, opened = next, 1, true
		case at < len(closing):
			// cur failed before its COMMIT was confirmed, and next's
			// statements were not run: begin it again, unless the
			// connection is gone.
			rollback(cur.ctx, conn)
			ch.done(cur.plan, nil, err)
			if conn.Conn().PgConn().IsClosed() {
				ch.done(nxt, nil, err)
				return
			}
			cur, try, opened = next, 1, false
		default:
			// cur committed; next failed to begin.
			ch.done(cur.plan, deferred, nil)
			cur, try = next, 1
			if !fail(err) {
				return
			}
		}
	}
}

// maxTries bounds the tries of an own transaction that PostgreSQL aborted
// for a deadlock or a serialization failure, or (coalesced batches) whose
// INSERT waited past insertGuard. Such a transaction committed nothing, so
// trying again is invisible.
const maxTries = 3

// retryMode says whether a transaction whose try number try, in lock mode
// mode, failed with err and was rolled back on conn may run again, and in
// which mode.
func retryMode(conn *pgxpool.Conn, err error, mode lockMode, try int) (lockMode, bool) {
	if try >= maxTries || conn.Conn().PgConn().IsClosed() {
		return mode, false
	}
	switch sqlState(err) {
	case pgerrcode.LockNotAvailable:
		// Only a batch's INSERT has a lock_timeout that is ours to handle.
		return skipLockedNoInsert, mode == skipLocked
	case pgerrcode.DeadlockDetected, pgerrcode.SerializationFailure:
		return mode, true
	}
	return mode, false
}

// rollback ends the transaction conn is in after a failure, if it is in
// one; a connection that cannot roll back is closed (the pool discards it).
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	pc := conn.Conn().PgConn()
	if pc.IsClosed() || pc.TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		pc.Close(context.WithoutCancel(ctx))
	}
}

// followAll is a context that is cancelled when every one of ctxs has
// ended; one that can never end keeps it going.
func followAll(ctxs ...context.Context) (context.Context, context.CancelFunc) {
	for _, c := range ctxs {
		if c.Done() == nil {
			return context.Background(), func() {}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(ctxs)))
	stops := make([]func() bool, len(ctxs))
	for i, c := range ctxs {
		stops[i] = context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// pgxExecutor pipelines statements in one pgx batch, on a pool connection
// or in a pgx.Tx.
type pgxExecutor struct {
	q interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}
}

func (e pgxExecutor) pipeline(ctx context.Context, stmts []stmt) error {
	_, err := e.pipelineAt(ctx, stmts)
	return err
}

// pipelineAt is pipeline that also says how many statements the server
// confirmed: on an error, stmts[at] failed (or its answer was lost) and the
// ones after it did not run.
func (e pgxExecutor) pipelineAt(ctx context.Context, stmts []stmt) (at int, err error) {
	b := &pgx.Batch{}
	for _, s := range stmts {
		qq := b.Queue(s.sql, s.args...)
		if scan := s.scan; scan != nil {
			qq.Query(func(rows pgx.Rows) error {
				if err := scan(rows); err != nil {
					return err
				}
				at++
				return nil
			})
		} else {
			qq.Exec(func(pgconn.CommandTag) error { at++; return nil })
		}
	}
	err = e.q.SendBatch(ctx, b).Close() // runs the callbacks above, counting at
	return at, err
}

// sqlExecutor runs statements one after another in a database/sql
// transaction, which cannot pipeline.
type sqlExecutor struct{ tx *sql.Tx }

func (e sqlExecutor) pipeline(ctx context.Context, stmts []stmt) error {
	for _, s := range stmts {
		if s.scan == nil {
			if _, err := e.tx.ExecContext(ctx, s.sql, s.args...); err != nil {
				return err
			}
			continue
		}
		rows, err := e.tx.QueryContext(ctx, s.sql, s.args...)
		if err != nil {
			return err
		}
		err = s.scan(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

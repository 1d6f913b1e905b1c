package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The runner sends a plan's statements: in a transaction of its own on a
// pool connection (RunOwn, RunChain), or in the caller's transaction (RunIn).

// Stmt is one statement and, for one that returns rows, how to read them.
type Stmt struct {
	SQL  string
	Args []any
	Scan func(RowScanner) error // nil for statements that return no rows
	// Changes, when not 0, is how many rows the statement (one without
	// Scan) must change: another count is errChanged.
	Changes int64
}

// errChanged is a statement's failure to change the rows it names
// (Stmt.Changes): a bug of ours, which the requests of the transaction
// get as their error, and tests see. It is read with the statement's
// result, so a COMMIT sent in the same round trip has run by then: it
// reports a lost write, it does not prevent one.
var errChanged = errors.New("pgratelimit: an UPDATE did not change the rows the transaction holds")

// changed checks that a statement s that changed n rows changed
// s.Changes.
func (s Stmt) changed(n int64) error {
	if s.Changes != 0 && n != s.Changes {
		return fmt.Errorf("%w (%d of %d)", errChanged, n, s.Changes)
	}
	return nil
}

// RowScanner is what pgx.Rows and *sql.Rows have in common.
type RowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Executor sends statements to the database: pipelined in one round trip on
// pgx, one after another on database/sql.
type Executor interface {
	Pipeline(ctx context.Context, stmts []Stmt) error
}

// RunIn runs p (not own) in the caller's transaction on ex: its isolation,
// its lock_timeout, no retries (a failed statement fails the caller's
// transaction).
func RunIn(ctx context.Context, ex Executor, p *Plan) error {
	a := p.attempt(ctx, p.mode)
	if err := ex.Pipeline(ctx, a.open()); err != nil {
		return err
	}
	if _, err := a.decide(ex); err != nil {
		return err
	}
	return ex.Pipeline(ctx, a.close())
}

// Chain supplies the transactions that follow one another on a connection
// (see runChain), and is told how each one ended.
type Chain interface {
	// Next returns the plan to run after the one just decided (which
	// deferred deferred) and the context to run it in, or nil.
	Next(after *Plan, deferred []*Request) (*Plan, context.Context)
	// Done is called once per plan, when it has committed (err nil) or
	// failed.
	Done(p *Plan, deferred []*Request, err error)
}

// RunOwn runs p in a transaction of its own on a connection of pool and
// returns the requests it deferred.
func RunOwn(ctx context.Context, pool *pgxpool.Pool, p *Plan) (deferred []*Request, err error) {
	var one single
	RunChain(ctx, pool, p, &one)
	return one.deferred, one.err
}

// single is the chain of one plan.
type single struct {
	deferred []*Request
	err      error
}

func (*single) Next(*Plan, []*Request) (*Plan, context.Context) { return nil, nil }
func (s *single) Done(_ *Plan, deferred []*Request, err error)  { s.deferred, s.err = deferred, err }

// RunChain runs own transactions one after another on one connection of
// pool: first, then each plan ch.next returns once the one before it is
// decided, until it returns none. The statements that end one (UPDATE,
// COMMIT) and those that begin the next (BEGIN, INSERT, SELECT) go in one
// round trip, so while the chain lasts a transaction costs the wire one
// round trip, not two. The next transaction may share rows with the one
// before it: it locks them after that one's COMMIT.
//
// A transaction that fails before it commits with an error that trying again
// can cure (retryMode) is tried again on the connection, up to maxTries; a
// COMMIT the server confirmed is a commit, even if the connection fails
// right after. One that fails in the round trip that was to begin the next
// is tried again waiting for its rows' locks, so that it defers nothing and
// the next still follows it (its statements did not run); when it cannot be
// tried again, the next begins afresh.
func RunChain(ctx context.Context, pool *pgxpool.Pool, first *Plan, ch Chain) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		ch.Done(first, nil, err)
		return
	}
	defer conn.Release()
	r := &chainRun{conn: conn, ex: PgxExecutor{Q: conn}, ch: ch, cur: first.attempt(ctx, first.mode), try: 1}
	for r.step() {
	}
}

// chainRun is RunChain under way on conn.
type chainRun struct {
	conn   *pgxpool.Conn
	ex     PgxExecutor
	ch     Chain
	cur    *Attempt // the transaction under way
	try    int      // cur's try
	opened bool     // cur's first round trip is done
	// queued is the next transaction when cur failed in the round trip
	// that was to begin it: it follows cur's next try.
	queued *Attempt
}

// step runs r.cur up to its end, and the beginning of the next transaction
// if there is one; it says whether there is more to run.
func (r *chainRun) step() bool {
	cur := r.cur
	if !r.opened {
		if _, err := r.ex.pipelineAt(cur.ctx, cur.open()); err != nil {
			return r.fail(err)
		}
		r.opened = true
	}
	deferred, err := cur.decide(r.ex)
	if err != nil {
		return r.fail(err)
	}
	closing := cur.close()
	var next *Attempt
	if r.queued != nil {
		next, r.queued = r.queued, nil
	} else if nxt, nctx := r.ch.Next(cur.Plan, deferred); nxt != nil {
		next = nxt.attempt(nctx, nxt.mode)
	}
	if next == nil {
		if at, err := r.ex.pipelineAt(cur.ctx, closing); err != nil && at < len(closing) {
			return r.fail(err)
		}
		cur.committed()
		r.ch.Done(cur.Plan, deferred, nil)
		return false
	}
	both, cancel := FollowAll(cur.ctx, next.ctx)
	at, err := r.ex.pipelineAt(both, append(closing, next.open()...))
	cancel()
	switch {
	case err == nil:
		cur.committed()
		r.ch.Done(cur.Plan, deferred, nil)
		r.cur, r.try, r.opened = next, 1, true
		return true
	case at < len(closing):
		// cur failed before its COMMIT was confirmed, and next's statements
		// were not run: next follows cur's next try, or begins afresh.
		r.queued = next.Plan.attempt(next.ctx, next.mode)
		return r.fail(err)
	}
	// cur committed; next failed to begin.
	cur.committed()
	r.ch.Done(cur.Plan, deferred, nil)
	r.cur, r.try = next, 1
	return r.fail(err)
}

// fail rolls back r.cur after err and readies its next try, or reports err
// and readies the queued transaction; it says whether there is more to run.
func (r *chainRun) fail(err error) bool {
	rollback(r.cur.ctx, r.conn)
	r.opened = false
	if mode, again := retryMode(r.conn, err, r.cur.mode, r.try); again {
		if r.queued != nil {
			mode = WaitLocks // defer nothing: the queued one may share its rows
		}
		r.cur, r.try = r.cur.Plan.attempt(r.cur.ctx, mode), r.try+1
		return true
	}
	r.ch.Done(r.cur.Plan, nil, err)
	if r.queued == nil {
		return false
	}
	if r.conn.Conn().PgConn().IsClosed() {
		r.ch.Done(r.queued.Plan, nil, err)
		return false
	}
	r.cur, r.try, r.queued = r.queued, 1, nil
	return true
}

// decide decides a's requests (decideAll), then runs its observers' reads
// between decision and close, if they have any.
func (a *Attempt) decide(ex Executor) (deferred []*Request, err error) {
	if deferred, err = a.decideAll(ex); err != nil {
		return nil, err
	}
	if follow := a.follow(); len(follow) > 0 {
		if err := ex.Pipeline(a.ctx, follow); err != nil {
			return nil, err
		}
	}
	return deferred, nil
}

// maxTries bounds the tries of an own transaction that PostgreSQL aborted
// for a deadlock or a serialization failure, or (coalesced batches) whose
// INSERT waited past InsertGuard. Such a transaction committed nothing, so
// trying again is invisible.
const maxTries = 3

// retryMode says whether a transaction whose try number try, in lock mode
// mode, failed with err and was rolled back on conn may run again, and in
// which mode.
func retryMode(conn *pgxpool.Conn, err error, mode LockMode, try int) (LockMode, bool) {
	if try >= maxTries || conn.Conn().PgConn().IsClosed() {
		return mode, false
	}
	switch SQLState(err) {
	case pgerrcode.LockNotAvailable:
		// Only a batch's INSERT has a lock_timeout that is ours to handle.
		return SkipLockedNoInsert, mode == SkipLocked
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

// FollowAll is a context that is cancelled when every one of ctxs has
// ended; one that can never end keeps it going.
func FollowAll(ctxs ...context.Context) (context.Context, context.CancelFunc) {
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

// PgxExecutor pipelines statements in one pgx batch, on a pool connection
// or in a pgx.Tx.
type PgxExecutor struct {
	Q interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}
}

// Pipeline sends stmts in one round trip.
func (e PgxExecutor) Pipeline(ctx context.Context, stmts []Stmt) error {
	_, err := e.pipelineAt(ctx, stmts)
	return err
}

// pipelineAt is pipeline that also says how many statements the server
// confirmed: on an error, stmts[at] failed (or its answer was lost) and the
// ones after it did not run.
func (e PgxExecutor) pipelineAt(ctx context.Context, stmts []Stmt) (at int, err error) {
	b := &pgx.Batch{}
	for _, s := range stmts {
		qq := b.Queue(s.SQL, s.Args...)
		if scan := s.Scan; scan != nil {
			qq.Query(func(rows pgx.Rows) error {
				if err := scan(rows); err != nil {
					return err
				}
				at++
				return nil
			})
		} else {
			qq.Exec(func(tag pgconn.CommandTag) error {
				if err := s.changed(tag.RowsAffected()); err != nil {
					return err
				}
				at++
				return nil
			})
		}
	}
	err = e.Q.SendBatch(ctx, b).Close() // runs the callbacks above, counting at
	return at, err
}

// SQLExecutor runs statements one after another in a database/sql
// transaction, which cannot pipeline.
type SQLExecutor struct{ Tx *sql.Tx }

// Pipeline runs stmts one after another.
func (e SQLExecutor) Pipeline(ctx context.Context, stmts []Stmt) error {
	for _, s := range stmts {
		if s.Scan == nil {
			res, err := e.Tx.ExecContext(ctx, s.SQL, s.Args...)
			if err != nil {
				return err
			}
			if s.Changes != 0 {
				n, err := res.RowsAffected()
				if err != nil {
					return err
				}
				if err := s.changed(n); err != nil {
					return err
				}
			}
			continue
		}
		rows, err := e.Tx.QueryContext(ctx, s.SQL, s.Args...)
		if err != nil {
			return err
		}
		err = s.Scan(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// RunAlone runs q in a transaction of its own that waits for its rows, and
// returns q's error (what names it in errors).
func RunAlone(pool *pgxpool.Pool, q *Request, set Settings, what string) error {
	if _, err := RunOwn(q.Ctx, pool, NewPlan([]*Request{q}, set, true, WaitLocks)); err != nil {
		return DBError(what, err)
	}
	return q.Result()
}

// Result is q's error once its transaction has ended: its own, or its
// context's if the engine skipped it (the context ended before it was
// decided: nothing was spent).
func (q *Request) Result() error {
	if q.Err != nil {
		return q.Err
	}
	if !q.Decided() {
		if err := q.Ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The engine runs one transaction over any set of requests: one check of one
// key, an AllowAll over several buckets, or a coalesced batch of many
// checks; in a transaction of its own or in the caller's. Its shape is always
// the same:
//
//	BEGIN                                           -- own transactions only
//	INSERT ... ON CONFLICT (prefix, key) DO NOTHING -- every row, per table
//	SELECT ... ORDER BY prefix, key FOR UPDATE      -- and the clock, after the locks
//	-- every request decided in Go, in order, each all or nothing
//	UPDATE ...                                      -- the rows that changed, if any
//	COMMIT                                          -- own transactions only
//
// pipelined into two round trips. Rows are locked in one global order (table,
// prefix, key), so no two transactions of ours can deadlock.

// row identifies a bucket: its table and primary key.
type row struct {
	storage     Storage
	prefix, key string
}

func compareRows(a, b row) int {
	if a.storage != b.storage {
		return int(a.storage) - int(b.storage)
	}
	if c := strings.Compare(a.prefix, b.prefix); c != 0 { // byte order, as the tables' COLLATE "C"
		return c
	}
	return strings.Compare(a.key, b.key)
}

// charge is what a request takes from (or gives to) one bucket: the costs of
// every Charge of that bucket added up, decided by the first one's policy.
type charge struct {
	row    row
	policy policy
	cost   int64
}

// request is one check: one or more charges decided together, all or
// nothing, and its outcome.
type request struct {
	ctx     context.Context
	charges []charge // one per distinct bucket
	of      []int    // Charge i of the call is charges[of[i]]; nil: one Charge
	give    bool     // Refund: add the cost instead of taking it

	out MultiResult
	err error
}

// rows returns the request's distinct rows.
func (q *request) rows() []row {
	rs := make([]row, len(q.charges))
	for i, c := range q.charges {
		rs[i] = c.row
	}
	return rs
}

// decide applies q to the buckets as stored (brought to now by each charge's
// policy) and records its outcome; when it is allowed, stored takes the new
// buckets. A denied request changes nothing, exactly as if the buckets had
// been read from the table one check at a time.
func (q *request) decide(stored map[row]bucket, now time.Time) {
	results := make([]Result, len(q.charges))
	var buf [2 * 4]bucket // next and loaded of up to 4 charges, without allocating
	next, loaded := buf[:0:4], buf[4:4]
	if len(q.charges) > 4 {
		next, loaded = make([]bucket, 0, len(q.charges)), make([]bucket, 0, len(q.charges))
	}
	next, loaded = next[:len(q.charges)], loaded[:len(q.charges)]
	allowed := true
	for i, c := range q.charges {
		loaded[i] = c.policy.load(stored[c.row], now)
		if q.give {
			next[i], results[i] = c.policy.give(loaded[i], now, c.cost)
		} else {
			next[i], results[i] = c.policy.take(loaded[i], now, c.cost)
		}
		allowed = allowed && results[i].Allowed
	}
	var retry time.Duration
	for i, c := range q.charges {
		switch {
		case !allowed && results[i].Allowed:
			// This bucket had enough, another did not: nothing is taken.
			results[i] = c.policy.result(loaded[i], now, c.cost, true)
		case allowed && (!q.give || next[i].tokens != loaded[i].tokens):
			// (A refund to a full bucket writes nothing: the row keeps
			// meaning what it meant, e.g. a missing row stays missing.)
			stored[c.row] = next[i]
		}
		retry = max(retry, results[i].RetryAfter)
	}
	q.out = MultiResult{Allowed: allowed, Results: results}
	if !allowed {
		q.out.RetryAfter = retry
	}
	if q.of != nil {
		q.out.Results = make([]Result, len(q.of))
		for i, j := range q.of {
			q.out.Results[i] = results[j]
		}
	}
}

// executor sends statements to the database: pipelined in one round trip on
// pgx, one after another on database/sql.
type executor interface {
	pipeline(ctx context.Context, stmts []stmt) error
}

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

// txRun is one transaction's worth of requests.
type txRun struct {
	reqs  []*request
	clock any // the clock parameter: nil for the database's, else a time
	// skip locks with SKIP LOCKED: requests whose rows another transaction
	// holds are not decided but returned as deferred, and so are the
	// requests after them that share a row, so that each row's requests are
	// decided in order. Without skip, the transaction waits for the locks.
	skip bool
	// noInsert leaves out the INSERT (with skip only): missing rows are then
	// deferred like held ones.
	noInsert bool
	// perRow sends statements of one row each, whatever the number of rows
	// (distributed tables); else only for a few rows (perRowMax) or in the
	// caller's transaction.
	perRow bool
	// The settings of an own transaction that waits for its locks
	// (Config.LockTimeout) and of every own transaction (AsyncCommit).
	lockTimeout time.Duration
	async       bool

	// What the transaction has found so far (see open).
	arrays    bool                     // statements over arrays, not one row each
	rows      []row                    // distinct, in lock order
	horizons  map[row]time.Duration    // of new rows (see statements.insert)
	intervals map[time.Duration]string // horizons as interval input
	stored    map[row]bucket           // the rows locked, then as decided
	orig      map[row]bucket           // the rows as locked
	now       time.Time                // the clock, after the locks
}

// perRowMax is the most rows sent as statements of one row each rather than
// one statement over arrays.
const perRowMax = 4

// run is a transaction of reqs with l's clock and settings.
func (l *Limiter) run(ctx context.Context, reqs []*request, skip bool) *txRun {
	return &txRun{reqs: reqs, clock: l.now(), skip: skip, lockTimeout: l.cfg.LockTimeout, async: l.cfg.AsyncCommit,
		perRow: l.shared.distributed(ctx, l.pool)}
}

// settings are the setting pairs set right after BEGIN: names and values
// of our own making, never the caller's.
func (t *txRun) settings(arrays bool) []any {
	var s []any
	if arrays {
		// Plan the array statements once per connection (a generic plan),
		// and only as nested loops over the arrays with an index lookup
		// per row: the plan that fits a batch whatever the table's size
		// or statistics were when it was made (an empty table's would scan
		// it whole). Planning each batch instead cost a third of the
		// server's time per check.
		s = append(s, "plan_cache_mode", "force_generic_plan",
			"enable_seqscan", "off", "enable_hashjoin", "off", "enable_mergejoin", "off")
	}
	switch {
	case t.skip && !t.noInsert:
		s = append(s, "lock_timeout", strconv.FormatInt(insertGuard.Milliseconds(), 10)+"ms")
	case !t.skip && t.lockTimeout > 0:
		s = append(s, "lock_timeout", strconv.FormatInt(t.lockTimeout.Milliseconds(), 10)+"ms")
	}
	if t.async {
		s = append(s, "synchronous_commit", "off")
	}
	return s
}

// exec runs t on ex; own says the transaction is ours (BEGIN and COMMIT are
// sent), else it runs inside the caller's. It records every decided
// request's outcome, marks the requests whose context ended before the
// decision (they spend nothing), and returns the deferred ones.
func (t *txRun) exec(ctx context.Context, ex executor, own bool) (deferred []*request, err error) {
	if err := ex.pipeline(ctx, t.open(own)); err != nil {
		return nil, err
	}
	if deferred, err = t.decideAll(ctx, ex); err != nil {
		return nil, err
	}
	if stmts := t.close(own); len(stmts) > 0 {
		if err := ex.pipeline(ctx, stmts); err != nil {
			return nil, err
		}
	}
	return deferred, nil
}

// open returns the statements that begin t, up to the locks (BEGIN only
// when own), and readies t to take their rows.
func (t *txRun) open(own bool) []stmt {
	t.rows = t.rows[:0]
	t.horizons = make(map[row]time.Duration, len(t.reqs))
	for _, q := range t.reqs {
		for _, c := range q.charges {
			t.rows = append(t.rows, c.row)
			if _, ok := t.horizons[c.row]; !ok && !q.give {
				// How long after a new row's first check it is full again:
				// the INSERT stores that expiry (see statements.insert).
				t.horizons[c.row] = c.policy.untilTokens(bucket{tokens: c.policy.capacity - c.cost}, time.Time{}, c.policy.capacity)
			}
		}
	}
	slices.SortFunc(t.rows, compareRows)
	t.rows = slices.Compact(t.rows)
	t.stored = make(map[row]bucket, len(t.rows))
	t.now = time.Time{}
	// The array statements run only in our own transactions, whose
	// settings make their plans (see settings); in the caller's they would
	// be planned under the caller's settings, and that plan cached for ours.
	t.arrays = !t.perRow && len(t.rows) > perRowMax && own

	var stmts []stmt
	if own {
		stmts = append(stmts, stmt{sql: "BEGIN"})
		switch set := t.settings(t.arrays); {
		case len(set) == 0:
		case t.perRow:
			// Distributed tables: SET LOCAL commands, which Citus passes on
			// to the workers (where the row locks are) when told to.
			stmts = append(stmts, stmt{sql: "SET LOCAL citus.propagate_set_commands = 'local'"})
			for i := 0; i < len(set); i += 2 {
				stmts = append(stmts, stmt{sql: "SET LOCAL " + set[i].(string) + " = '" + set[i+1].(string) + "'"})
			}
		default:
			stmts = append(stmts, stmt{sql: setConfigSQL(len(set) / 2), args: set})
		}
	}
	for s, part := range byStorage(t.rows) {
		sql := s.statements()
		lock, lock1 := sql.lock, sql.lock1
		if t.skip {
			lock, lock1 = sql.lockSkip, sql.lockSkip1
		}
		if !t.arrays {
			if !t.noInsert {
				for _, r := range part {
					stmts = append(stmts, stmt{sql: sql.insert1, args: []any{r.prefix, r.key, t.interval(r), t.clock}})
				}
			}
			for _, r := range part {
				stmts = append(stmts, stmt{sql: lock1, args: []any{r.prefix, r.key, t.clock}, scan: t.scanInto(s)})
			}
			continue
		}
		if !t.noInsert {
			stmts = append(stmts, stmt{sql: sql.insert, args: []any{prefixArray(part), keyArray(part), t.horizonArray(part), t.clock}})
		}
		stmts = append(stmts, stmt{sql: lock, args: []any{prefixArray(part), keyArray(part), t.clock}, scan: t.scanInto(s)})
	}
	return stmts
}

// interval is the horizon of r as interval input; the rows of a batch mostly
// share one, formatted once.
func (t *txRun) interval(r row) string {
	h := t.horizons[r]
	s, ok := t.intervals[h]
	if !ok {
		s = interval(h)
		if t.intervals == nil {
			t.intervals = make(map[time.Duration]string, 1)
		}
		t.intervals[h] = s
	}
	return s
}

func (t *txRun) horizonArray(rows []row) string {
	return textArray(len(rows), func(i int) string { return t.interval(rows[i]) })
}

// scanInto reads locked rows of storage s, with the clock.
func (t *txRun) scanInto(s Storage) func(rowScanner) error {
	return func(rs rowScanner) error {
		// Scanned into once per statement, not once per row: Scan moves
		// them to the heap.
		var (
			r     row
			b     bucket
			clock time.Time
		)
		for rs.Next() {
			r, b = row{storage: s}, bucket{}
			if err := rs.Scan(&r.prefix, &r.key, &b.tokens, &b.refilledAt, &b.expiresAt, &clock); err != nil {
				return err
			}
			t.stored[r] = b
			// Rows are locked in order, so the last clock read is after
			// every lock is held.
			if clock.After(t.now) {
				t.now = clock
			}
		}
		return rs.Err()
	}
}

// decideAll decides t's requests on the rows open locked: in order, each
// all or nothing. A request that needs a row t does not hold (skipped, or
// missing without an INSERT) is deferred, and so is every later request
// sharing a row with it.
func (t *txRun) decideAll(ctx context.Context, ex executor) (deferred []*request, err error) {
	missing := make(map[row]bool)
	for _, r := range t.rows {
		if _, ok := t.stored[r]; !ok {
			missing[r] = true
		}
	}
	if len(missing) > 0 && !t.skip {
		// A cleanup deleted rows between our INSERT and SELECT: insert
		// them again, locked, in this transaction.
		var again []row
		for _, r := range t.rows {
			if missing[r] {
				again = append(again, r)
			}
		}
		var stmts []stmt
		for s, part := range byStorage(again) {
			if !t.arrays {
				for _, r := range part {
					stmts = append(stmts, stmt{sql: s.statements().relock1, args: []any{r.prefix, r.key, t.interval(r), t.clock}, scan: t.scanInto(s)})
				}
				continue
			}
			stmts = append(stmts, stmt{sql: s.statements().relock, args: []any{prefixArray(part), keyArray(part), t.horizonArray(part), t.clock}, scan: t.scanInto(s)})
		}
		if err := ex.pipeline(ctx, stmts); err != nil {
			return nil, err
		}
		if len(t.stored) < len(t.rows) {
			return nil, errors.New("pgratelimit: upsert returned no row") // cannot happen
		}
		clear(missing)
	}
	if t.clock != nil {
		t.now = t.clock.(time.Time)
	}

	t.orig = maps.Clone(t.stored)
	blocked := missing
	for _, q := range t.reqs {
		if err := q.ctx.Err(); err != nil {
			q.err = err // gave up before the decision: nothing spent
			continue
		}
		if len(blocked) > 0 && slices.ContainsFunc(q.charges, func(c charge) bool { return blocked[c.row] }) {
			deferred = append(deferred, q)
			for _, c := range q.charges {
				blocked[c.row] = true
			}
			continue
		}
		q.err = nil
		q.decide(t.stored, t.now)
	}
	return deferred, nil
}

// close returns the statements that end t: the UPDATE of the rows that
// changed, and COMMIT when own.
func (t *txRun) close(own bool) []stmt {
	var stmts []stmt
	var changed []row
	for _, r := range t.rows {
		if b, ok := t.stored[r]; ok && !b.same(t.orig[r]) {
			changed = append(changed, r)
		}
	}
	for s, part := range byStorage(changed) {
		if !t.arrays {
			for _, r := range part {
				b := t.stored[r]
				stmts = append(stmts, stmt{sql: s.statements().update1, args: []any{r.prefix, r.key, b.tokens, b.refilledAt, b.expiresAt}})
			}
			continue
		}
		stmts = append(stmts, stmt{sql: s.statements().update, args: []any{
			prefixArray(part), keyArray(part),
			int64Array(len(part), func(i int) int64 { return t.stored[part[i]].tokens }),
			timeArray(len(part), func(i int) time.Time { return t.stored[part[i]].refilledAt }),
			timeArray(len(part), func(i int) time.Time { return t.stored[part[i]].expiresAt }),
		}})
	}
	if own {
		stmts = append(stmts, stmt{sql: "COMMIT"})
	}
	return stmts
}

// byStorage yields the parts of sorted rows that share a table, in order.
func byStorage(rows []row) func(yield func(Storage, []row) bool) {
	return func(yield func(Storage, []row) bool) {
		for len(rows) > 0 {
			n := 1
			for n < len(rows) && rows[n].storage == rows[0].storage {
				n++
			}
			if !yield(rows[0].storage, rows[:n]) {
				return
			}
			rows = rows[n:]
		}
	}
}

func prefixArray(rows []row) string {
	return textArray(len(rows), func(i int) string { return rows[i].prefix })
}

func keyArray(rows []row) string {
	return textArray(len(rows), func(i int) string { return rows[i].key })
}

// setConfigSQL is a statement that sets n settings for the transaction:
// $1 to $2, $3 to $4, and so on.
func setConfigSQL(n int) string { return setConfigSQLs[n] }

// setConfigSQLs holds the statement for every number of settings
// txRun.settings can make (at most 6 pairs).
var setConfigSQLs = func() (sqls [7]string) {
	for n := 1; n < len(sqls); n++ {
		calls := make([]string, n)
		for i := range calls {
			calls[i] = fmt.Sprintf("set_config($%d, $%d, true)", 2*i+1, 2*i+2)
		}
		sqls[n] = "SELECT " + strings.Join(calls, ", ")
	}
	return sqls
}()

// insertGuard bounds how long a coalesced batch's INSERT may wait for
// another transaction that inserted one of its keys and has not committed
// (an AllowNTx in a long transaction, say). Past it the batch runs again
// without the INSERT, and the checks of missing rows wait on their own rows.
const insertGuard = 20 * time.Millisecond

// maxTries bounds the tries of a transaction of our own that PostgreSQL
// aborted for a deadlock or a serialization failure, or (coalesced batches)
// whose INSERT waited past insertGuard. Such a transaction committed
// nothing, so trying again is invisible.
const maxTries = 3

// runOwn runs t in a transaction of its own on a connection of pool.
func runOwn(ctx context.Context, pool *pgxpool.Pool, t *txRun) (deferred []*request, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	for try := 1; ; try++ {
		deferred, err = t.exec(ctx, pgxExecutor{conn}, true)
		if err == nil {
			return deferred, nil
		}
		rollback(ctx, conn)
		if !t.retry(conn, err, try) {
			return nil, err
		}
	}
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

// retry says whether t, rolled back after its try number try failed with
// err, is to be tried again on conn, and readies it for that.
func (t *txRun) retry(conn *pgxpool.Conn, err error, try int) bool {
	var pgErr *pgconn.PgError
	if try >= maxTries || !errors.As(err, &pgErr) || conn.Conn().PgConn().IsClosed() {
		return false
	}
	switch {
	case pgErr.Code == pgerrcode.LockNotAvailable && t.skip && !t.noInsert:
		t.noInsert = true
		return true
	case pgErr.Code == pgerrcode.DeadlockDetected || pgErr.Code == pgerrcode.SerializationFailure:
		return true
	}
	return false
}

// link is a transaction of a chain (see runChain) and the context it runs in.
type link struct {
	ctx context.Context
	t   *txRun
}

// runChain runs transactions of their own one after another on one
// connection of pool: first, then each one that next returns once the one
// before it is decided (given what that one deferred), until next has none. The statements that end one
// (UPDATE, COMMIT) and those that begin the next (BEGIN, INSERT, SELECT) go
// in one round trip, so while the chain lasts a transaction costs the wire
// one round trip, not two. The next transaction may share rows with the one
// before it: it locks them after that one's COMMIT. done is called with each
// transaction's outcome once it has committed or failed.
func runChain(pool *pgxpool.Pool, first link, next func(after *txRun, deferred []*request) (link, bool), done func(t *txRun, deferred []*request, err error)) {
	conn, err := pool.Acquire(first.ctx)
	if err != nil {
		done(first.t, nil, err)
		return
	}
	defer conn.Release()
	ex := pgxExecutor{conn}
	cur, opened, tries := first, false, 0 // tries: how often cur failed to begin
	for {
		for !opened {
			_, err := ex.pipelineAt(cur.ctx, cur.t.open(true))
			if err == nil {
				opened = true
				break
			}
			tries++
			rollback(cur.ctx, conn)
			if !cur.t.retry(conn, err, tries) {
				done(cur.t, nil, err)
				return
			}
		}
		deferred, err := cur.t.decideAll(cur.ctx, ex)
		if err != nil {
			rollback(cur.ctx, conn)
			done(cur.t, nil, err)
			return
		}
		nxt, ok := next(cur.t, deferred)
		if !ok {
			if _, err := ex.pipelineAt(cur.ctx, cur.t.close(true)); err != nil {
				rollback(cur.ctx, conn)
				done(cur.t, nil, err)
				return
			}
			done(cur.t, deferred, nil)
			return
		}
		closing := cur.t.close(true)
		ctx, cancel := followAll(cur.ctx, nxt.ctx)
		at, err := ex.pipelineAt(ctx, append(closing, nxt.t.open(true)...))
		cancel()
		switch {
		case err == nil:
			done(cur.t, deferred, nil)
			opened, tries = true, 0
		case at < len(closing):
			// cur failed, and nxt's statements were not run: begin it
			// again, unless the connection is gone.
			rollback(cur.ctx, conn)
			done(cur.t, nil, err)
			if conn.Conn().PgConn().IsClosed() {
				done(nxt.t, nil, err)
				return
			}
			opened, tries = false, 0
		default:
			// cur committed; nxt failed to begin.
			done(cur.t, deferred, nil)
			rollback(nxt.ctx, conn)
			if !nxt.t.retry(conn, err, 1) {
				done(nxt.t, nil, err)
				return
			}
			opened, tries = false, 1
		}
		cur = nxt
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

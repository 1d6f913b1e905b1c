package pgratelimit

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
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
	rows := make([]row, 0, len(t.reqs))
	horizons := make(map[row]time.Duration, len(t.reqs))
	for _, q := range t.reqs {
		for _, c := range q.charges {
			rows = append(rows, c.row)
			if _, ok := horizons[c.row]; !ok && !q.give {
				// How long after a new row's first check it is full again:
				// the INSERT stores that expiry (see statements.insert).
				horizons[c.row] = c.policy.untilTokens(bucket{tokens: c.policy.capacity - c.cost}, time.Time{}, c.policy.capacity)
			}
		}
	}
	slices.SortFunc(rows, compareRows)
	rows = slices.Compact(rows)
	// The rows of a batch mostly share a horizon: format each once.
	intervals := make(map[time.Duration]string, 1)
	intervalOf := func(r row) string {
		h := horizons[r]
		s, ok := intervals[h]
		if !ok {
			s = interval(h)
			intervals[h] = s
		}
		return s
	}
	horizonArray := func(rows []row) string {
		return textArray(len(rows), func(i int) string { return intervalOf(rows[i]) })
	}

	stored := make(map[row]bucket, len(rows))
	var now time.Time
	scanInto := func(s Storage) func(rowScanner) error {
		return func(rs rowScanner) error {
			// Scanned into once per statement, not once per row: Scan
			// moves them to the heap.
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
				stored[r] = b
				// Rows are locked in order, so the last clock read is
				// after every lock is held.
				if clock.After(now) {
					now = clock
				}
			}
			return rs.Err()
		}
	}

	// The array statements run only in our own transactions, whose
	// settings make their plans (see settings); in the caller's they would
	// be planned under the caller's settings, and that plan cached for ours.
	perRow := t.perRow || len(rows) <= perRowMax || !own
	var stmts []stmt
	if own {
		stmts = append(stmts, stmt{sql: "BEGIN"})
		switch set := t.settings(!perRow); {
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
	for s, part := range byStorage(rows) {
		sql := s.statements()
		lock, lock1 := sql.lock, sql.lock1
		if t.skip {
			lock, lock1 = sql.lockSkip, sql.lockSkip1
		}
		switch {
		case perRow:
			if !t.noInsert {
				for _, r := range part {
					stmts = append(stmts, stmt{sql: sql.insert1, args: []any{r.prefix, r.key, intervalOf(r), t.clock}})
				}
			}
			for _, r := range part {
				stmts = append(stmts, stmt{sql: lock1, args: []any{r.prefix, r.key, t.clock}, scan: scanInto(s)})
			}
		default:
			if !t.noInsert {
				stmts = append(stmts, stmt{sql: sql.insert, args: []any{prefixArray(part), keyArray(part), horizonArray(part), t.clock}})
			}
			stmts = append(stmts, stmt{sql: lock, args: []any{prefixArray(part), keyArray(part), t.clock}, scan: scanInto(s)})
		}
	}
	if err := ex.pipeline(ctx, stmts); err != nil {
		return nil, err
	}

	missing := make(map[row]bool)
	for _, r := range rows {
		if _, ok := stored[r]; !ok {
			missing[r] = true
		}
	}
	if len(missing) > 0 && !t.skip {
		// A cleanup deleted rows between our INSERT and SELECT: insert
		// them again, locked, in this transaction.
		var again []row
		for _, r := range rows {
			if missing[r] {
				again = append(again, r)
			}
		}
		stmts = stmts[:0]
		for s, part := range byStorage(again) {
			if perRow {
				for _, r := range part {
					stmts = append(stmts, stmt{sql: s.statements().relock1, args: []any{r.prefix, r.key, intervalOf(r), t.clock}, scan: scanInto(s)})
				}
				continue
			}
			stmts = append(stmts, stmt{sql: s.statements().relock, args: []any{prefixArray(part), keyArray(part), horizonArray(part), t.clock}, scan: scanInto(s)})
		}
		if err := ex.pipeline(ctx, stmts); err != nil {
			return nil, err
		}
		if len(stored) < len(rows) {
			return nil, errors.New("pgratelimit: upsert returned no row") // cannot happen
		}
		clear(missing)
	}
	if t.clock != nil {
		now = t.clock.(time.Time)
	}

	// Decide in order. A request that needs a row this transaction does not
	// hold waits, and so does every later request sharing a row with it.
	orig := maps.Clone(stored)
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
		q.decide(stored, now)
	}

	stmts = stmts[:0]
	var changed []row
	for _, r := range rows {
		if b, ok := stored[r]; ok && !b.same(orig[r]) {
			changed = append(changed, r)
		}
	}
	for s, part := range byStorage(changed) {
		if perRow {
			for _, r := range part {
				b := stored[r]
				stmts = append(stmts, stmt{sql: s.statements().update1, args: []any{r.prefix, r.key, b.tokens, b.refilledAt, b.expiresAt}})
			}
			continue
		}
		stmts = append(stmts, stmt{sql: s.statements().update, args: []any{
			prefixArray(part), keyArray(part),
			int64Array(len(part), func(i int) int64 { return stored[part[i]].tokens }),
			timeArray(len(part), func(i int) time.Time { return stored[part[i]].refilledAt }),
			timeArray(len(part), func(i int) time.Time { return stored[part[i]].expiresAt }),
		}})
	}
	if own {
		stmts = append(stmts, stmt{sql: "COMMIT"})
	}
	if len(stmts) > 0 {
		if err := ex.pipeline(ctx, stmts); err != nil {
			return nil, err
		}
	}
	return deferred, nil
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

var setConfigSQLs = [...]string{
	1: `SELECT set_config($1, $2, true)`,
	2: `SELECT set_config($1, $2, true), set_config($3, $4, true)`,
	3: `SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true)`,
	4: `SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true), set_config($7, $8, true)`,
	5: `SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true), set_config($7, $8, true), set_config($9, $10, true)`,
	6: `SELECT set_config($1, $2, true), set_config($3, $4, true), set_config($5, $6, true), set_config($7, $8, true), set_config($9, $10, true), set_config($11, $12, true)`,
}

func setConfigSQL(n int) string { return setConfigSQLs[n] }

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
	ex := pgxExecutor{conn}
	for try := 1; ; try++ {
		deferred, err = t.exec(ctx, ex, true)
		if err == nil {
			return deferred, nil
		}
		if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, rerr := conn.Exec(rctx, "ROLLBACK")
			cancel()
			if rerr != nil {
				conn.Conn().PgConn().Close(context.WithoutCancel(ctx)) // the pool discards it
			}
		}
		var pgErr *pgconn.PgError
		if try >= maxTries || !errors.As(err, &pgErr) || conn.Conn().PgConn().IsClosed() {
			return nil, err
		}
		switch {
		case pgErr.Code == pgerrcode.LockNotAvailable && t.skip && !t.noInsert:
			t.noInsert = true
		case pgErr.Code == pgerrcode.DeadlockDetected || pgErr.Code == pgerrcode.SerializationFailure:
		default:
			return nil, err
		}
	}
}

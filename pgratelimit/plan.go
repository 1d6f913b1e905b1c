package pgratelimit

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// The engine runs one transaction over any set of requests: one check of one
// key, an AllowAll over several buckets, or a coalesced batch of many
// checks; in a transaction of its own or in the caller's. Its shape is always
// the same:
//
//	BEGIN                                           -- own transactions only
//	INSERT ... ON CONFLICT (prefix, key) DO NOTHING -- every row, per table
//	SELECT ... FOR UPDATE                           -- in (prefix, key) order, and the clock after the locks
//	-- every request decided in Go, in order, each all or nothing
//	UPDATE ...                                      -- the rows that changed, if any
//	COMMIT                                          -- own transactions only
//
// pipelined into two round trips. Rows are locked in one global order (table,
// prefix, key), so no two transactions of ours can deadlock.
//
// A plan is such a transaction, fixed before it runs (this file); an attempt
// is one try of it; the runner (runner.go) sends an attempt's statements,
// which its shape (shape.go) builds in the dialect's words (dialect.go) from
// the SQL in statements.go.

// lockMode says what a transaction does about row locks that other
// transactions hold.
type lockMode int8

const (
	// waitLocks waits for every row lock: a check run alone, a lane of
	// parked checks, a check in the caller's transaction.
	waitLocks lockMode = iota
	// skipLocked skips rows that another transaction holds (SKIP LOCKED):
	// the requests that need them are deferred (a coalesced batch). Its
	// INSERT waits at most insertGuard for another transaction's new row.
	skipLocked
	// skipLockedNoInsert is skipLocked without the INSERT, for a batch whose
	// INSERT waited past insertGuard: missing rows are deferred like held
	// ones.
	skipLockedNoInsert
)

// settings are what the requests of one transaction must share: the
// database's dialect, the clock and the transaction settings of their
// limiters. Comparable: coalesced batches hold checks of equal settings.
type settings struct {
	dialect     dialect
	clock       *clock // nil: the database's
	lockTimeout time.Duration
	async       bool
}

// clock is a Config.Clock, by pointer so that settings compare.
type clock struct{ now func() time.Time }

// param is the clock parameter of the statements: nil for the database's
// clock, else the time truncated to PostgreSQL's microseconds.
func (c *clock) param() any {
	if c == nil {
		return nil
	}
	return c.now().Truncate(time.Microsecond).UTC()
}

// plan is one transaction's worth of requests, fixed before it runs.
type plan struct {
	reqs  []*request
	set   settings
	own   bool     // BEGIN and COMMIT are ours; else it runs in the caller's transaction
	mode  lockMode // of the first attempt
	shape shape
	clock any // the clock parameter, read once
	// spendsGrants: a charge's account has grants (Config.Grants), so the
	// durable rows are locked with their grants (see statements.lockGrants).
	spendsGrants bool
	// hasIDs: a request carries a request ID, so its request rows are read
	// after the locks.
	hasIDs bool
	// grants: a request makes a grant, so a new grant ID is read first.
	grants bool

	rows      []row                    // distinct, in lock order
	horizons  map[row]time.Duration    // of new rows (see statements.insert)
	intervals map[time.Duration]string // horizons as interval input, formatted once
}

// perRowMax is the most rows an own transaction sends as statements of one
// row each rather than one statement over arrays.
const perRowMax = 4

// newPlan plans a transaction of reqs with the settings set.
func newPlan(reqs []*request, set settings, own bool, mode lockMode) *plan {
	p := &plan{reqs: reqs, set: set, own: own, mode: mode, clock: set.clock.param(),
		horizons: make(map[row]time.Duration, len(reqs))}
	for _, q := range reqs {
		p.hasIDs = p.hasIDs || q.id != ""
		p.grants = p.grants || q.kind == account.OpGrant
		for _, c := range q.charges {
			p.rows = append(p.rows, c.row)
			p.spendsGrants = p.spendsGrants || c.grants
			if _, ok := p.horizons[c.row]; !ok && q.kind == account.OpCharge {
				// How long after a new row's first check it is full again:
				// the INSERT stores that expiry (see statements.insert).
				p.horizons[c.row] = c.policy.Horizon(c.cost)
			}
		}
	}
	slices.SortFunc(p.rows, compareRows)
	p.rows = slices.Compact(p.rows)
	p.shape = set.dialect.shape(len(p.rows), own)
	return p
}

// interval is the horizon of r as interval input; the rows of a batch mostly
// share one, formatted once.
func (p *plan) interval(r row) string {
	h := p.horizons[r]
	s, ok := p.intervals[h]
	if !ok {
		s = sqlgen.Interval(h)
		if p.intervals == nil {
			p.intervals = make(map[time.Duration]string, 1)
		}
		p.intervals[h] = s
	}
	return s
}

// attempt is one try of a plan, and what it has found so far.
type attempt struct {
	*plan
	ctx   context.Context
	mode  lockMode
	state map[row]*account.State // the accounts locked, then as decided
	orig  map[row]account.State  // the accounts as locked
	now   time.Time              // the clock, after the locks
	// grantID is the ID of a grant a request makes (grants).
	grantID int64

	// What the decisions write besides the buckets and grants.
	records []recordWrite // request records, new or settled
	ledger  [][]any       // ledger rows
	resets  []row         // rows to delete
}

func (p *plan) attempt(ctx context.Context, mode lockMode) *attempt {
	return &attempt{plan: p, ctx: ctx, mode: mode, state: make(map[row]*account.State, len(p.rows))}
}

// settingPairs are the names and values set right after BEGIN: of our own
// making, never the caller's.
func (a *attempt) settingPairs() []string {
	s := a.shape.settings()
	switch {
	case a.mode == skipLocked:
		s = append(s, "lock_timeout", strconv.FormatInt(insertGuard.Milliseconds(), 10)+"ms")
	case a.mode == waitLocks && a.set.lockTimeout > 0:
		s = append(s, "lock_timeout", strconv.FormatInt(a.set.lockTimeout.Milliseconds(), 10)+"ms")
	}
	if a.set.async {
		s = append(s, "synchronous_commit", "off")
	}
	return s
}

// open returns the statements that begin a, up to the locks (BEGIN and the
// settings only in an own transaction).
func (a *attempt) open() []stmt {
	var stmts []stmt
	if a.own {
		stmts = append(stmts, stmt{sql: "BEGIN"})
		if set := a.settingPairs(); len(set) > 0 {
			stmts = append(stmts, a.set.dialect.set(set)...)
		}
		stmts = append(stmts, a.shape.guard(a)...)
	}
	if a.grants {
		stmts = append(stmts, stmt{sql: sqlgen.Grants.NextID, args: []any{GrantsTable}, scan: func(rs rowScanner) error {
			for rs.Next() {
				if err := rs.Scan(&a.grantID); err != nil {
					return err
				}
			}
			return rs.Err()
		}})
	}
	for s, part := range byStorage(a.rows) {
		if a.mode != skipLockedNoInsert {
			stmts = append(stmts, a.shape.insert(s, part, a)...)
		}
		stmts = append(stmts, a.shape.lock(s, part, a)...)
	}
	if a.hasIDs {
		stmts = append(stmts, a.readIDs()...)
	}
	return append(stmts, a.shape.clock(a)...)
}

// readClock is the statement that reads the database's clock into a.now,
// for shapes whose locking statements do not (citusRow).
func (a *attempt) readClock() stmt {
	return stmt{sql: `SELECT clock_timestamp()`, scan: func(rs rowScanner) error {
		for rs.Next() {
			var t time.Time
			if err := rs.Scan(&t); err != nil {
				return err
			}
			if t.After(a.now) {
				a.now = t
			}
		}
		return rs.Err()
	}}
}

// withGrants says whether a's statements over rows of s read their grants.
func (a *attempt) withGrants(s Storage) bool { return a.spendsGrants && s == Durable }

// scanInto reads locked rows of storage s, with the clock, and with their
// grants when withGrants (a row per grant, or one with NULL grant columns).
func (a *attempt) scanInto(s Storage) func(rowScanner) error {
	return a.scanRows(s, a.withGrants(s), false)
}

// scanRows is scanInto, with grant columns when grants, and with a Citus
// shard's placement check (shardRows) when placed: a row whose shard this
// node no longer holds fails the transaction with errShardMoved.
func (a *attempt) scanRows(s Storage, grants, placed bool) func(rowScanner) error {
	return func(rs rowScanner) error {
		// Scanned into once per statement, not once per row: Scan moves
		// them to the heap.
		var (
			r          row
			b          account.Bucket
			capacity   *int64 // NULL: written by an older release
			clock      time.Time
			id, amount *int64 // NULL: no grant
			exp        *time.Time
			ledger     *bool
		)
		var here int64 // placements of the row's shard on this node
		dest := []any{&r.prefix, &r.key, &b.Tokens, &b.RefilledAt, &b.ExpiresAt, &capacity, &clock}
		if placed {
			dest = append(dest, &here)
		}
		if grants {
			dest = append(dest, &id, &amount, &exp, &ledger)
		}
		for rs.Next() {
			r, b, capacity, id, amount, exp, ledger = row{storage: s}, account.Bucket{}, nil, nil, nil, nil, nil
			if err := rs.Scan(dest...); err != nil {
				return err
			}
			if placed && here != 1 {
				return errShardMoved
			}
			if capacity != nil {
				b.Capacity = *capacity
			}
			st := a.state[r]
			if st == nil {
				st = &account.State{}
				a.state[r] = st
			}
			st.Bucket = b
			if id != nil {
				g := account.Grant{ID: *id, Amount: *amount, Ledger: *ledger}
				if exp != nil {
					g.ExpiresAt = *exp
				}
				st.Grants = append(st.Grants, g)
			}
			// Rows are locked in order, so the last clock read is after
			// every lock is held (or by a statement of its own after them,
			// see citusRow).
			if clock.After(a.now) {
				a.now = clock
			}
		}
		return rs.Err()
	}
}

// decideAll decides a's requests on the rows open locked: in order, each
// all or nothing. A request that needs a row a does not hold (skipped, or
// missing without an INSERT) is deferred, and so is every later request
// sharing a row with it. Requests whose context has ended are not decided:
// they spend nothing.
func (a *attempt) decideAll(ex executor) (deferred []*request, err error) {
	missing := make(map[row]bool)
	for _, r := range a.rows {
		if _, ok := a.state[r]; !ok {
			missing[r] = true
		}
	}
	if len(missing) > 0 && a.mode == waitLocks {
		// A cleanup deleted rows between our INSERT and SELECT: insert
		// them again, locked, in this transaction.
		var again []row
		for _, r := range a.rows {
			if missing[r] {
				again = append(again, r)
			}
		}
		var stmts []stmt
		for s, part := range byStorage(again) {
			stmts = append(stmts, a.shape.relock(s, part, a)...)
		}
		if err := ex.pipeline(a.ctx, stmts); err != nil {
			return nil, err
		}
		if len(a.state) < len(a.rows) {
			return nil, errors.New("pgratelimit: upsert returned no row") // cannot happen
		}
		clear(missing)
	}
	if a.clock != nil {
		a.now = a.clock.(time.Time)
	}

	a.orig = make(map[row]account.State, len(a.state))
	for r, st := range a.state {
		a.orig[r] = account.State{Bucket: st.Bucket, Grants: slices.Clone(st.Grants)}
	}
	blocked := missing
	for _, q := range a.reqs {
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
		q.err, q.out = nil, MultiResult{}
		a.decide(q)
	}
	return deferred, nil
}

// close returns the statements that end a: the UPDATE of the rows that
// changed, the grants, request records and ledger rows its decisions wrote,
// the rows they reset, and COMMIT in an own transaction.
func (a *attempt) close() []stmt {
	var stmts []stmt
	var changed []row
	for _, r := range a.rows {
		if st, ok := a.state[r]; ok && !st.Bucket.Same(a.orig[r].Bucket) && !slices.Contains(a.resets, r) {
			changed = append(changed, r)
		}
	}
	for s, part := range byStorage(changed) {
		stmts = append(stmts, a.shape.update(s, part, a)...)
	}
	if grants := a.grantRows(); len(grants) > 0 {
		stmts = append(stmts, a.shape.values(sqlgen.Grants.Write, grants, nil)...)
	}
	if len(a.records) > 0 {
		vals := make([][]any, len(a.records))
		for i, w := range a.records {
			vals[i] = w.values()
		}
		stmts = append(stmts, a.shape.values(sqlgen.Requests.Write, vals, nil)...)
	}
	if len(a.ledger) > 0 {
		stmts = append(stmts, a.shape.values(sqlgen.Ledger.Write, a.ledger, nil)...)
	}
	for _, r := range a.resets {
		stmts = append(stmts, stmt{sql: r.storage.statements().Remove, args: []any{r.prefix, r.key}})
	}
	if a.own {
		stmts = append(stmts, stmt{sql: "COMMIT"})
	}
	return stmts
}

// grantRows are the grants whose amounts a's decisions changed, and the new
// ones, as rows of sqlgen.Grants.Write, in lock order.
func (a *attempt) grantRows() [][]any {
	var out [][]any
	for _, r := range a.rows {
		st, ok := a.state[r]
		if !ok {
			continue
		}
		read := a.orig[r].Grants
		for _, g := range st.Grants {
			i := slices.IndexFunc(read, func(o account.Grant) bool { return o.ID == g.ID })
			if i >= 0 && read[i].Amount == g.Amount {
				continue
			}
			exp, ledger := "", int64(0)
			if !g.ExpiresAt.IsZero() {
				exp = g.ExpiresAt.UTC().Format(time.RFC3339Nano)
			}
			if g.Ledger {
				ledger = 1
			}
			at := g.GrantedAt
			if at.IsZero() {
				at = a.now
			}
			out = append(out, []any{r.prefix, r.key, g.ID, g.Amount, exp, at, ledger})
		}
	}
	return out
}

// insertGuard bounds how long a coalesced batch's INSERT may wait for
// another transaction that inserted one of its keys and has not committed
// (an AllowNTx in a long transaction, say). Past it the batch runs again
// without the INSERT (skipLockedNoInsert), and the checks of missing rows
// wait on their own rows.
const insertGuard = 20 * time.Millisecond

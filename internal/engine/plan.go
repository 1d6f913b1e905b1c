package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Plan is one transaction's worth of requests, fixed before it runs.
type Plan struct {
	reqs  []*Request
	set   Settings
	own   bool     // BEGIN and COMMIT are ours; else it runs in the caller's transaction
	mode  LockMode // of the first attempt
	shape Shape
	clock any // the clock parameter, read once
	// spendsGrants: a charge's account has grants (Config.Grants), so the
	// durable rows are locked with their grants (see statements.lockGrants).
	spendsGrants bool
	// hasIDs: a request carries a request ID, so its request rows are read
	// after the locks.
	hasIDs bool
	// grants: a request makes a grant, so a new grant ID is read first.
	grants bool
	// readsData: a charge is a Part's, so the locks read the rows' leases
	// column (Data) too.
	readsData bool
	// readsOverrides: a charge has Overrides, so the locks read the rows'
	// overrides (sqlgen.Table.Overrides, or on Citus a statement of their
	// own after each lock).
	readsOverrides bool

	rows      []Row                    // distinct, in lock order
	inserts   []Row                    // the rows a batch inserts, when not all (Charge.NoInsert)
	horizons  map[Row]time.Duration    // of new rows (see statements.insert)
	intervals map[time.Duration]string // horizons as interval input, formatted once
}

// NewPlan plans a transaction of reqs with the settings set: of its own
// (own) or in the caller's, first tried in lock mode mode.
func NewPlan(reqs []*Request, set Settings, own bool, mode LockMode) *Plan {
	p := &Plan{reqs: reqs, set: set, own: own, mode: mode, clock: set.Clock.Param(),
		horizons: make(map[Row]time.Duration, len(reqs))}
	noInsert := false
	for _, q := range reqs {
		p.hasIDs = p.hasIDs || q.ID != ""
		p.grants = p.grants || q.Kind == account.OpGrant
		for _, c := range q.Charges {
			p.rows = append(p.rows, c.Row)
			p.spendsGrants = p.spendsGrants || c.Policy.Grants
			p.readsData = p.readsData || c.Part != nil
			p.readsOverrides = p.readsOverrides || c.Overrides
			noInsert = noInsert || c.NoInsert
			if _, ok := p.horizons[c.Row]; !ok && q.Kind == account.OpCharge && c.Part == nil {
				// How long after a new row's first check it is full again:
				// the INSERT stores that expiry (see statements.insert).
				p.horizons[c.Row] = c.Policy.Horizon(c.Cost)
			}
		}
	}
	slices.SortFunc(p.rows, CompareRows)
	p.rows = slices.Compact(p.rows)
	p.inserts = p.rows
	if noInsert {
		p.inserts = p.needInsert()
	}
	p.shape = set.Dialect.Shape(len(p.rows), own)
	return p
}

// needInsert returns the rows of p that a charge needs inserted (not
// Charge.NoInsert), in lock order.
func (p *Plan) needInsert() []Row {
	var need []Row
	for _, q := range p.reqs {
		for _, c := range q.Charges {
			if !c.NoInsert {
				need = append(need, c.Row)
			}
		}
	}
	slices.SortFunc(need, CompareRows)
	return slices.Compact(need)
}

// Interval is the horizon of r as interval input; the rows of a batch mostly
// share one, formatted once.
func (p *Plan) Interval(r Row) string {
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

// Attempt is one try of a plan, and what it has found so far.
type Attempt struct {
	*Plan
	ctx   context.Context
	mode  LockMode
	state map[Row]*account.State // the accounts locked, then as decided
	orig  map[Row]account.State  // the accounts as locked
	tids  map[Row]pgtype.TID     // the rows' ctids, read by array locks (see sqlgen.Table.Update)
	now   time.Time              // the clock, after the locks
	// grantID is the ID of a grant a request makes (grants).
	grantID int64

	// What the decisions write besides the buckets and grants.
	records []recordWrite     // request records, new or settled
	ledger  [][]any           // ledger rows
	resets  []Row             // rows to delete
	locals  map[any]any       // the parts' and observers' state (Local)
	data    map[Row]string    // the rows' leases column, when not NULL (Data)
	keep    map[Row]time.Time // the rows whose leases column to write, and their expiry at least (SetData)
	notes   [][]any           // notifications (channel, payload), in order (Notify)
	// overrides are the rows' overrides as read (readsOverrides), and
	// overrideWrites the rows whose override an OpPlan request sets or
	// clears, in order.
	overrides      map[Row]Override
	overrideWrites []overrideWrite
	// unknown are the rows whose copy of their override the locks found
	// unknown and resolved: close writes the copy of those it writes.
	unknown []Row
}

// overrideWrite is an override set on a row (o not nil), or cleared.
type overrideWrite struct {
	row Row
	o   *Override
}

func (p *Plan) attempt(ctx context.Context, mode LockMode) *Attempt {
	return &Attempt{Plan: p, ctx: ctx, mode: mode, state: make(map[Row]*account.State, len(p.rows))}
}

// settingPairs are the names and values set right after BEGIN: of our own
// making, never the caller's.
func (a *Attempt) settingPairs() []string {
	s := a.shape.Settings()
	switch {
	case a.mode == SkipLocked:
		s = append(s, "lock_timeout", strconv.FormatInt(InsertGuard.Milliseconds(), 10)+"ms")
	case a.mode == WaitLocks && a.set.LockTimeout > 0:
		s = append(s, "lock_timeout", strconv.FormatInt(a.set.LockTimeout.Milliseconds(), 10)+"ms")
	}
	if a.set.Async {
		s = append(s, "synchronous_commit", "off")
	}
	return s
}

// open returns the statements that begin a, up to the locks (BEGIN and the
// settings only in an own transaction).
func (a *Attempt) open() []Stmt {
	var stmts []Stmt
	if a.own {
		stmts = append(stmts, Stmt{SQL: "BEGIN"})
		if set := a.settingPairs(); len(set) > 0 {
			stmts = append(stmts, a.set.Dialect.Set(set)...)
		}
		stmts = append(stmts, a.shape.Guard(a)...)
	}
	if a.grants {
		stmts = append(stmts, Stmt{SQL: sqlgen.Grants.NextID, Args: []any{sqlgen.GrantsTable}, Scan: func(rs RowScanner) error {
			for rs.Next() {
				if err := rs.Scan(&a.grantID); err != nil {
					return err
				}
			}
			return rs.Err()
		}})
	}
	inserts := a.rows
	switch a.mode {
	case SkipLocked:
		inserts = a.inserts // a missing row a charge does not insert defers its request
	case SkipLockedNoInsert:
		inserts = nil
	}
	stmts = append(stmts, a.holdOthers(true)...)
	for s, part := range byStorage(a.rows) {
		if ins := storageRows(inserts, s); len(ins) > 0 {
			stmts = append(stmts, a.shape.Insert(s, ins, a)...)
		}
		stmts = append(stmts, a.shape.Lock(s, part, a)...)
	}
	stmts = append(stmts, a.holdOthers(false)...)
	if a.hasIDs {
		stmts = append(stmts, a.readIDs()...)
	}
	for _, p := range a.parts() {
		stmts = append(stmts, p.Read(a, a.chargesOf(p))...)
	}
	return append(stmts, a.shape.Clock(a)...)
}

// readsGrants says whether a's statements over rows of s read their grants.
func (a *Attempt) readsGrants(s Storage) bool { return a.spendsGrants && s == Durable }

// scanInto reads locked rows of storage s, with the clock, and with their
// grants when withGrants (a row per grant, or one with NULL grant columns).
func (a *Attempt) scanInto(s Storage) func(RowScanner) error {
	return a.scanRows(s, lockCols{grants: a.readsGrants(s)})
}

// grantOf is the grant of a lock's grant columns (exp nil: it never
// expires).
func grantOf(id, amount int64, exp *time.Time, ledger bool) account.Grant {
	g := account.Grant{ID: id, Amount: amount, Ledger: ledger}
	if exp != nil {
		g.ExpiresAt = *exp
	}
	return g
}

// hold notes that a holds row r, its bucket b, its leases column (nil:
// NULL) and its ctid (nil: not read), and returns its state.
func (a *Attempt) hold(r Row, b account.Bucket, leases *string, tid *pgtype.TID) *account.State {
	st := a.state[r]
	if st == nil {
		st = &account.State{}
		a.state[r] = st
	}
	st.Bucket = b
	if tid != nil {
		if a.tids == nil {
			a.tids = make(map[Row]pgtype.TID, len(a.rows))
		}
		a.tids[r] = *tid
	}
	if leases != nil {
		if a.data == nil {
			a.data = make(map[Row]string, len(a.rows))
		}
		a.data[r] = *leases
	}
	return st
}

// lockCols are the columns a locking statement returns besides the row's
// bucket and clock (and its leases column and override, as a reads them).
type lockCols struct {
	// at: the statement sent these rows (an array lock), and returns each
	// row's position among them (1-based) instead of its prefix and key.
	at []Row
	// grants: the row's grants (a row per grant, or one with NULLs).
	grants bool
	// placed: a Citus shard's placement check (shardRows): a row whose
	// shard this node no longer holds fails the transaction with
	// ErrShardMoved.
	placed bool
	// tid: the row's ctid, before the clock (see sqlgen.Table.Update).
	tid bool
}

// scanRows is scanInto, with the columns c of rows of storage s.
func (a *Attempt) scanRows(s Storage, c lockCols) func(RowScanner) error {
	return func(rs RowScanner) error {
		// Scanned into once per statement, not once per row: Scan moves
		// them to the heap.
		var (
			r          Row
			at         int64
			b          account.Bucket
			capacity   pgtype.Int8 // NULL: written by an older release
			leases     *string
			ovCap      *int64 // the row's copy: NULL, no override; sqlgen.Unknown, unknown
			ovRefill   *int64
			ovUntil    *time.Time
			ovRead     *string // an unknown copy's override, as read after the lock (see sqlgen.Table.Overrides)
			ctid       pgtype.TID
			clock      time.Time
			here       int64  // placements of the row's shard on this node
			id, amount *int64 // NULL: no grant
			exp        *time.Time
			ledger     *bool
		)
		dest := []any{&r.Prefix, &r.Key}
		if c.at != nil {
			dest = []any{&at}
		}
		dest = append(dest, &b.Tokens, &b.RefilledAt, &b.ExpiresAt, &capacity)
		if a.readsData {
			dest = append(dest, &leases)
		}
		if a.inlineOverrides() {
			dest = append(dest, &ovCap, &ovRefill, &ovUntil, &ovRead)
		}
		if c.tid {
			dest = append(dest, &ctid)
		}
		dest = append(dest, &clock)
		if c.placed {
			dest = append(dest, &here)
		}
		if c.grants {
			dest = append(dest, &id, &amount, &exp, &ledger)
		}
		for rs.Next() {
			r, b, leases, id, amount, exp, ledger = Row{Storage: s}, account.Bucket{}, nil, nil, nil, nil, nil
			ovCap, ovRefill, ovUntil, ovRead = nil, nil, nil, nil
			if err := rs.Scan(dest...); err != nil {
				return err
			}
			switch {
			case c.placed && here != 1:
				return ErrShardMoved
			case c.at == nil:
			case at < 1 || at > int64(len(c.at)):
				return fmt.Errorf("pgratelimit: a lock returned row %d of %d", at, len(c.at)) // cannot happen
			default:
				r = c.at[at-1]
			}
			b.Capacity = capacity.Int64 // 0 when NULL
			var tid *pgtype.TID
			if c.tid {
				tid = &ctid
			}
			st := a.hold(r, b, leases, tid)
			if err := a.noteOverride(r, ovCap, ovRefill, ovUntil, ovRead); err != nil {
				return err
			}
			if id != nil {
				st.Grants = append(st.Grants, grantOf(*id, *amount, exp, *ledger))
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
func (a *Attempt) decideAll(ex Executor) (deferred []*Request, err error) {
	missing := make(map[Row]bool)
	for _, r := range a.rows {
		if _, ok := a.state[r]; !ok {
			missing[r] = true
		}
	}
	if len(missing) > 0 && a.mode == WaitLocks {
		// A cleanup deleted rows between our INSERT and SELECT: insert
		// them again, locked, in this transaction.
		var again []Row
		for _, r := range a.rows {
			if missing[r] {
				again = append(again, r)
			}
		}
		var stmts []Stmt
		for s, part := range byStorage(again) {
			stmts = append(stmts, a.shape.Relock(s, part, a)...)
		}
		if err := ex.Pipeline(a.ctx, stmts); err != nil {
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

	a.orig = make(map[Row]account.State, len(a.state))
	for r, st := range a.state {
		a.orig[r] = account.State{Bucket: st.Bucket, Grants: slices.Clone(st.Grants)}
	}
	blocked := missing
	for _, q := range a.reqs {
		if err := q.Ctx.Err(); err != nil {
			q.Err = err // gave up before the decision: nothing spent
			continue
		}
		if len(blocked) > 0 && slices.ContainsFunc(q.Charges, func(c Charge) bool { return blocked[c.Row] }) {
			deferred = append(deferred, q)
			for _, c := range q.Charges {
				blocked[c.Row] = true
			}
			continue
		}
		q.Err, q.Outcomes, q.Allowed = nil, nil, false
		a.decideOne(q)
	}
	return deferred, nil
}

// close returns the statements that end a: the UPDATE of the rows that
// changed, the grants, request records and ledger rows its decisions wrote,
// the rows they reset, the parts' and observers' writes (the leases columns
// the parts set among them), the notifications, and COMMIT in an own
// transaction.
func (a *Attempt) close() []Stmt {
	var stmts []Stmt
	var changed []Row
	for _, r := range a.rows {
		if st, ok := a.state[r]; ok && !st.Bucket.Same(a.orig[r].Bucket) && !slices.Contains(a.resets, r) {
			changed = append(changed, r)
		}
	}
	for s, part := range byStorage(changed) {
		stmts = append(stmts, a.shape.Update(s, part, a)...)
	}
	for _, r := range a.unknown {
		if slices.Contains(changed, r) {
			stmts = append(stmts, a.markOf(r))
		}
	}
	if grants := a.grantRows(); len(grants) > 0 {
		stmts = append(stmts, a.shape.Values(sqlgen.Grants.Write, grants, nil)...)
	}
	if len(a.records) > 0 {
		vals := make([][]any, len(a.records))
		for i, w := range a.records {
			vals[i] = w.values()
		}
		stmts = append(stmts, a.shape.Values(sqlgen.Requests.Write, vals, nil)...)
	}
	if len(a.ledger) > 0 {
		stmts = append(stmts, a.shape.Values(sqlgen.Ledger.Write, a.ledger, nil)...)
	}
	for _, r := range a.resets {
		stmts = append(stmts, Stmt{SQL: r.Storage.Statements().Remove, Args: []any{r.Prefix, r.Key}})
	}
	for _, p := range a.parts() {
		stmts = append(stmts, p.Write(a)...)
	}
	if len(a.keep) > 0 {
		var rows []Row
		for _, r := range a.rows {
			if _, ok := a.keep[r]; ok {
				rows = append(rows, r)
			}
		}
		for s, part := range byStorage(rows) {
			stmts = append(stmts, a.shape.UpdateData(s, part, a)...)
		}
	}
	for _, o := range a.observers() {
		stmts = append(stmts, o.Write(a)...)
	}
	for _, w := range a.overrideWrites {
		stmts = append(stmts, w.stmts(a.now)...)
	}
	if len(a.notes) > 0 {
		sql := sqlgen.Notify
		if a.own {
			sql = sqlgen.NotifyUnbounded
		}
		stmts = append(stmts, a.shape.Values(sql, a.notes, nil)...)
	}
	if a.own {
		stmts = append(stmts, Stmt{SQL: "COMMIT"})
	}
	return stmts
}

// inlineOverrides says a's locks read the rows' overrides in the locking
// statements (sqlgen.Table.Overrides: the rows' copies, resolved), and its
// UPDATE writes them: on plain PostgreSQL. Citus's coordinator reads them with OverrideRead, a statement
// of its own after each lock; a routed transaction has no charge with
// Overrides.
func (a *Attempt) inlineOverrides() bool {
	return a.readsOverrides && a.set.Dialect.Name() != "citus"
}

// stmts are the statements that write w at now, under its rows' locks:
// the key's row of pgratelimit_overrides, and the override columns of its
// bucket rows in both tables (a limiter of the other storage on the same
// prefix reads them too; holdOthers made and locked the other table's).
func (w overrideWrite) stmts(now time.Time) []Stmt {
	marks := []Stmt{markStmt(w.row.Storage, w.row, w.o), markStmt(w.row.Storage.Other(), w.row, w.o)}
	if w.o == nil {
		return append([]Stmt{{SQL: sqlgen.Overrides.Clear, Args: []any{w.row.Prefix, w.row.Key}}}, marks...)
	}
	set := []any{w.row.Prefix, w.row.Key, w.o.Capacity, w.o.Refill, untilParam(w.o.Until), w.o.Note, now.UTC().Format(time.RFC3339Nano)}
	return append([]Stmt{{SQL: sqlgen.Overrides.Set, Args: set}}, marks...)
}

// markStmt writes the copy of o (nil: none) on the row of r's key in the
// table of storage s (sqlgen.Statements.Mark).
func markStmt(s Storage, r Row, o *Override) Stmt {
	args := []any{r.Prefix, r.Key, nil, nil, ""}
	if o != nil {
		args[2], args[3], args[4] = o.Capacity, o.Refill, untilParam(o.Until)
	}
	return Stmt{SQL: s.Statements().Mark, Args: args}
}

// untilParam is an override's end as a parameter: "" for none.
func untilParam(until time.Time) string {
	if until.IsZero() {
		return ""
	}
	return until.UTC().Format(time.RFC3339Nano)
}

// holdOthers makes (a placeholder, as a check's INSERT does, its copy of the
// override unknown until Mark writes it) and locks the rows of the other
// table whose override columns an OpPlan request of a writes
// (overrideWrite.stmts): before a's rows when that table comes first in the
// rows' order (the durable one, for a request on an ephemeral row), else
// after them, so that a locks rows in the one global order and deadlocks
// with no check that holds the key's rows of both. Made, not only written
// where it exists: a check of the other table that makes the row
// concurrently then meets this transaction on its primary key (waits for it,
// or fails to serialize under REPEATABLE READ), instead of reading, with a
// snapshot older than this transaction's commit (REPEATABLE READ), an
// override older than this one for a row this one did not see. An OpPlan
// request has one charge, and its plan no row of the other table.
func (a *Attempt) holdOthers(before bool) []Stmt {
	var stmts []Stmt
	for _, q := range a.reqs {
		if q.Kind != account.OpPlan {
			continue
		}
		for _, c := range q.Charges {
			if o := c.Row.Storage.Other(); (o < c.Row.Storage) == before {
				ts := o.Statements()
				stmts = append(stmts,
					Stmt{SQL: a.tableFor(&ts.One).Insert, Args: []any{c.Row.Prefix, c.Row.Key, a.Interval(c.Row), a.clock}},
					Stmt{SQL: ts.Hold, Args: []any{c.Row.Prefix, c.Row.Key}})
			}
		}
	}
	return stmts
}

// noteOverride notes the override the lock read of r (its copy, and what
// pgratelimit_override read of an unknown copy; see overrideOf), and
// whether r's copy was unknown.
func (a *Attempt) noteOverride(r Row, capacity, refill *int64, until *time.Time, read *string) error {
	if capacity == nil {
		return nil // no override
	}
	o, err := overrideOf(*capacity, refill, until, read)
	if err != nil {
		return fmt.Errorf("the override of key %q of prefix %q: %w", r.Key, r.Prefix, err)
	}
	if *capacity == sqlgen.Unknown {
		a.unknown = append(a.unknown, r)
	}
	if o != nil {
		a.setOverride(r, *o)
	}
	return nil
}

// overrideOf is the override a lock read of a row (sqlgen.Table.Overrides):
// its copy (capacity, refill, until), or, when the copy is unknown, what
// pgratelimit_override read after the lock ("" for none, else "capacity
// refill until", until in microseconds since the epoch or "-"). nil: none.
func overrideOf(capacity int64, refill *int64, until *time.Time, read *string) (*Override, error) {
	if capacity != sqlgen.Unknown {
		if refill == nil {
			return nil, fmt.Errorf("the row's copy has a capacity (%d) and no refill", capacity)
		}
		o := &Override{Capacity: capacity, Refill: *refill}
		if until != nil {
			o.Until = *until
		}
		return o, nil
	}
	if read == nil || *read == "" {
		return nil, nil
	}
	f := strings.Fields(*read)
	if len(f) != 3 {
		return nil, fmt.Errorf("pgratelimit_override returned %q", *read)
	}
	o := &Override{}
	var err1, err2 error
	o.Capacity, err1 = strconv.ParseInt(f[0], 10, 64)
	o.Refill, err2 = strconv.ParseInt(f[1], 10, 64)
	if f[2] != "-" {
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pgratelimit_override returned %q: %w", *read, err)
		}
		o.Until = time.UnixMicro(us).UTC()
	}
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgratelimit_override returned %q: %w", *read, err)
	}
	return o, nil
}

// markOf writes r's copy of its key's override as a's lock resolved it, so
// that r's copy is known from then on: for a row a writes whose copy was
// unknown. An override set or cleared in a (overrideWrites) is written
// after it.
func (a *Attempt) markOf(r Row) Stmt {
	if o, ok := a.overrides[r]; ok {
		return markStmt(r.Storage, r, &o)
	}
	return markStmt(r.Storage, r, nil)
}

// setOverride notes o as r's override, as read by a's locks.
func (a *Attempt) setOverride(r Row, o Override) {
	if a.overrides == nil {
		a.overrides = make(map[Row]Override, 1)
	}
	a.overrides[r] = o
}

// overrideRead is the statement that reads r's override into a after r's
// lock, when a reads overrides and its locks do not (Citus); else none.
func (a *Attempt) overrideRead(r Row) []Stmt {
	if !a.readsOverrides || a.inlineOverrides() {
		return nil
	}
	return []Stmt{ReadOverride(r, func(o Override) { a.setOverride(r, o) })}
}

// policyOf is the policy that decides c in a: its key's override's, while
// live by a's clock (a charge with Overrides), else its own.
func (a *Attempt) policyOf(c Charge) account.Policy {
	if c.Overrides {
		if o, ok := a.overrides[c.Row]; ok && o.Live(a.now) {
			return o.Policy(c.Policy)
		}
	}
	return c.Policy
}

// grantRows are the grants whose amounts a's decisions changed, and the new
// ones, as rows of sqlgen.Grants.Write, in lock order.
func (a *Attempt) grantRows() [][]any {
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
			out = append(out, []any{r.Prefix, r.Key, g.ID, g.Amount, exp, at, ledger})
		}
	}
	return out
}

// BatchSettings are the setting pairs of a coalesced batch over many rows
// (the array shape's, and SkipLocked's lock_timeout), for tests that plan
// its statements.
func BatchSettings() []string {
	return (&Attempt{Plan: &Plan{shape: arrays{}}, mode: SkipLocked}).settingPairs()
}

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/citus"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

// A transaction of many requests gives every one exactly the outcome it gets
// one by one, in the same order: single checks and AllowAlls, limiters that
// share a prefix with different policies (plans), both storages, the same
// bucket charged twice in one call.
func TestBatchEqualsOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	limiters := func() []*Limiter {
		pool := testdb.Pool(t)
		var ls []*Limiter
		for _, cfg := range []Config{
			{Prefix: "free", Capacity: 9, Refill: 2, Interval: time.Second},
			{Prefix: "free", Capacity: 20, Refill: 5, Interval: 3 * time.Second}, // a bigger plan, same buckets
			{Prefix: "org", Capacity: 30, Refill: 1, Interval: 500 * time.Millisecond, Storage: Ephemeral},
		} {
			cfg.Clock, cfg.DisableCoalescing = clock, true
			l, err := New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		}
		return ls
	}
	batched, single := limiters(), limiters()
	mkRequest := func(ls []*Limiter, spec [][3]int) call {
		var cs []Charge
		for _, s := range spec {
			cs = append(cs, ls[s[0]].Charge(fmt.Sprintf("k%d", s[1]), int64(s[2])))
		}
		q, _, err := newCall(ctx, nil, cs)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 40 {
		now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		var specs [][][3]int
		for range 2 + rng.IntN(30) {
			var spec [][3]int
			for range 1 + rng.IntN(3) {
				spec = append(spec, [3]int{rng.IntN(3), rng.IntN(4), 1 + rng.IntN(4)})
			}
			specs = append(specs, spec)
		}
		var calls []call
		var reqs []*engine.Request
		for _, spec := range specs {
			cl := mkRequest(batched, spec)
			calls, reqs = append(calls, cl), append(reqs, cl.q)
		}
		if _, err := engine.RunOwn(ctx, batched[0].client.pool, planOf(t, batched[0], reqs, engine.WaitLocks)); err != nil {
			t.Fatal(err)
		}
		for i, spec := range specs {
			want := mkRequest(single, spec)
			if _, err := engine.RunOwn(ctx, single[0].client.pool, planOf(t, single[0], []*engine.Request{want.q}, engine.WaitLocks)); err != nil {
				t.Fatal(err)
			}
			if reqs[i].Err != nil || !reflect.DeepEqual(calls[i].result(), want.result()) {
				t.Fatalf("round %d request %d %v: together %+v (%v), one by one %+v", round, i, spec, calls[i].result(), reqs[i].Err, want.result())
			}
		}
	}
	for i := range batched {
		for k := range 4 {
			key := fmt.Sprintf("k%d", k)
			a, _ := batched[i].Peek(ctx, key)
			b, _ := single[i].Peek(ctx, key)
			if a != b {
				t.Fatalf("limiter %d %s: together %+v, one by one %+v", i, key, a, b)
			}
		}
	}
}

// A member whose context ended before the decision spends nothing and leaves
// no row behind; the others are decided as if it were not there.
func TestCancelledMemberSpendsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := New(pool, Config{Prefix: "c", Capacity: 100, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	mk := func(ctx context.Context, key string, cost int64) *engine.Request {
		cl, _, err := newCall(ctx, nil, []Charge{l.Charge(key, cost)})
		if err != nil {
			t.Fatal(err)
		}
		return cl.q
	}
	reqs := []*engine.Request{mk(ctx, "k", 1), mk(dead, "k", 50), mk(dead, "new", 1), mk(ctx, "k", 2)}
	if _, err := engine.RunOwn(ctx, pool, planOf(t, l, reqs, engine.SkipLocked)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[1].Err, context.Canceled) || !errors.Is(reqs[2].Err, context.Canceled) || reqs[0].Err != nil || reqs[3].Err != nil {
		t.Fatalf("errors: %v %v %v %v", reqs[0].Err, reqs[1].Err, reqs[2].Err, reqs[3].Err)
	}
	if got := reqs[3].Outcomes[0].Remaining; got != 97 {
		t.Fatalf("remaining %d, want 97", got)
	}
	// The skipped check of a new key leaves at most a placeholder, which
	// reads as a missing row: its first real check starts its grid.
	var expired bool
	if err := pool.QueryRow(ctx, `SELECT coalesce(bool_and(expires_at < now() OR refilled_at = timestamptz '0001-01-01 00:00:00+00'), true) FROM pgratelimit_buckets WHERE key = 'new'`).Scan(&expired); err != nil || !expired {
		t.Fatalf("a skipped check left a live row: %v %v", expired, err)
	}
}

// The cost of the metrics with no MeterProvider installed (the global no-op
// one): what every check pays for them.
func BenchmarkMetricsNoop(b *testing.B) {
	l := &Limiter{metrics: newInstruments(nil, "p")}
	charges := []Charge{l.Charge("k", 1)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		record(ctx, time.Now(), MultiResult{Allowed: true}, nil, charges)
	}
}

// A batch's array statements are planned once per connection (a generic
// plan) under the settings of its transaction: whatever the table held when
// the plan was made (here nothing, never analyzed), every row is an index
// lookup (the UPDATE: a TID lookup, by the ctid the lock read) in a nested
// loop over the arrays, never a scan of the table.
func TestBatchPlansAreIndexLookups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if onCitus(t, pool) {
		t.Skip("distributed tables take one-row statements only")
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	set := engine.BatchSettings()
	for _, s := range (engine.Postgres{}).Set(set) {
		if _, err := tx.Exec(ctx, s.SQL, s.Args...); err != nil {
			t.Fatal(err)
		}
	}
	const rows, times = `'{p,p}', '{a,b}'`, `'{"2026-01-01 00:00:00Z","2026-01-01 00:00:00Z"}'`
	const horizons = `'{"1 hours 0 seconds","1 hours 0 seconds"}', NULL`
	for _, s := range []Storage{Durable, Ephemeral} {
		sql := s.statements()
		for i, c := range []struct {
			name, sql, args string
			lookup          string // each row's, in a nested loop
		}{
			{"insert", sql.Many.Insert, rows + ", " + horizons, "Index"},
			{"lock", sql.Many.Lock, rows + ", NULL", "Index Scan using"},
			{"lockSkip", sql.Many.LockSkip, rows + ", NULL", "Index Scan using"},
			{"relock", sql.Many.Relock, rows + ", " + horizons, ""},
			{"update", sql.Many.Update, `'{"(0,1)","(0,2)"}', '{1,2}', ` + times + ", " + times + ", '{5,5}'", "Tid Scan"},
			{"updateData", sql.Many.Data.UpdateData, `'{"(0,1)","(0,2)"}', '{"[]",""}', ` + times, "Tid Scan"},
		} {
			name := fmt.Sprintf("s%d_%d", s, i)
			if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+c.sql); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			var plan []string
			rs, err := tx.Query(ctx, "EXPLAIN (COSTS off) EXECUTE "+name+"("+c.args+")")
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			for rs.Next() {
				var line string
				if err := rs.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rs.Err(); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			text := strings.Join(plan, "\n")
			for _, bad := range []string{"Seq Scan", "Hash", "Merge", "Sort", "Bitmap"} {
				if strings.Contains(text, bad) {
					t.Errorf("%s on %v plans a %s:\n%s", c.name, s, bad, text)
				}
			}
			if c.lookup != "" && !(strings.Contains(text, "Nested Loop") && strings.Contains(text, c.lookup)) {
				t.Errorf("%s on %v is not a nested loop of lookups (%s):\n%s", c.name, s, c.lookup, text)
			}
		}
	}
}

// link is a transaction of a chain in a test, and the context it runs in.
type link struct {
	ctx context.Context
	p   *engine.Plan
}

// testChain is a chain of given links that records each one's outcome.
type testChain struct {
	t        *testing.T
	links    []link
	i        int
	order    []*engine.Plan
	deferred [][]*engine.Request
	errs     []error
}

func (c *testChain) Next(after *engine.Plan, _ []*engine.Request) (*engine.Plan, context.Context) {
	if after != c.links[c.i].p {
		c.t.Fatalf("next called after plan %p, want link %d", after, c.i)
	}
	c.i++
	if c.i == len(c.links) {
		return nil, nil
	}
	return c.links[c.i].p, c.links[c.i].ctx
}

func (c *testChain) Done(p *engine.Plan, d []*engine.Request, err error) {
	c.order = append(c.order, p)
	c.deferred = append(c.deferred, d)
	c.errs = append(c.errs, err)
}

// chainOf runs links as one chain and returns, for each link in the order
// done was called, its deferred requests and error.
func chainOf(t *testing.T, pool *pgxpool.Pool, links []link) (order []*engine.Plan, deferred [][]*engine.Request, errs []error) {
	t.Helper()
	c := &testChain{t: t, links: links}
	engine.RunChain(links[0].ctx, pool, links[0].p, c)
	return c.order, c.deferred, c.errs
}

// planOf plans reqs as l's own transaction in mode.
func planOf(t *testing.T, l *Limiter, reqs []*engine.Request, mode engine.LockMode) *engine.Plan {
	t.Helper()
	d, err := l.client.dialect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	set := l.settings()
	set.Dialect = d
	return engine.NewPlan(reqs, set, true, mode)
}

// onCitus says whether pool's bucket tables are distributed.
func onCitus(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	d, err := citus.Detect(context.Background(), engine.PgxExecutor{Q: pool})
	if err != nil {
		t.Fatal(err)
	}
	return d.Name() == "citus"
}

// Transactions chained on one connection, each sharing rows with the one
// before it, give every request exactly the outcome it gets one by one.
func TestChainEqualsOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	limiter := func() *Limiter {
		l, err := New(testdb.Pool(t), Config{Prefix: "ch", Capacity: 5, Refill: 1, Interval: time.Second, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	chained, single := limiter(), limiter()
	mk := func(l *Limiter, key string) call {
		cl, _, err := newCall(ctx, nil, []Charge{l.Charge(key, 2)})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var keys [][]string
	var links []link
	var calls [][]call
	for range 8 {
		var ks []string
		var cls []call
		var reqs []*engine.Request
		for range 1 + rng.IntN(8) {
			k := fmt.Sprintf("k%d", rng.IntN(3))
			ks = append(ks, k)
			cl := mk(chained, k)
			cls, reqs = append(cls, cl), append(reqs, cl.q)
		}
		keys, calls = append(keys, ks), append(calls, cls)
		links = append(links, link{ctx, planOf(t, chained, reqs, engine.SkipLocked)})
	}
	order, deferred, errs := chainOf(t, chained.client.pool, links)
	if len(order) != len(links) {
		t.Fatalf("done called %d times for %d links", len(order), len(links))
	}
	for i, ln := range links {
		if order[i] != ln.p || errs[i] != nil || len(deferred[i]) != 0 {
			t.Fatalf("link %d: done in order %v, err %v, deferred %d", i, order[i] == ln.p, errs[i], len(deferred[i]))
		}
		for j, cl := range calls[i] {
			want := mk(single, keys[i][j])
			if _, err := engine.RunOwn(ctx, single.client.pool, planOf(t, single, []*engine.Request{want.q}, engine.SkipLocked)); err != nil {
				t.Fatal(err)
			}
			if cl.q.Err != nil || !reflect.DeepEqual(cl.result(), want.result()) {
				t.Fatalf("link %d request %d (%s): chained %+v (%v), one by one %+v", i, j, keys[i][j], cl.result(), cl.q.Err, want.result())
			}
		}
	}
}

// When a transaction's UPDATE fails in a chain, it gets the error and spends
// nothing; the next one, whose statements were not run, begins again and is
// decided as if alone.
func TestChainAfterAFailedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if onCitus(t, pool) {
		t.Skip("a trigger on a distributed table needs citus.enable_unsafe_triggers")
	}
	for _, ddl := range []string{
		`CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom'; END $$`,
		`CREATE TRIGGER boom BEFORE UPDATE ON pgratelimit_buckets FOR EACH ROW WHEN (NEW.key = 'boom') EXECUTE FUNCTION boom()`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	l, err := New(pool, Config{Prefix: "f", Capacity: 10, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(key string) *engine.Request {
		cl, _, err := newCall(ctx, nil, []Charge{l.Charge(key, 3)})
		if err != nil {
			t.Fatal(err)
		}
		return cl.q
	}
	first, second := mk("boom"), mk("k")
	links := []link{{ctx, planOf(t, l, []*engine.Request{first}, engine.SkipLocked)}, {ctx, planOf(t, l, []*engine.Request{second}, engine.SkipLocked)}}
	_, _, errs := chainOf(t, pool, links)
	if len(errs) != 2 || errs[0] == nil || errs[1] != nil {
		t.Fatalf("errors %v, want the first link's only", errs)
	}
	if !second.Allowed || second.Outcomes[0].Remaining != 7 {
		t.Fatalf("second link: %+v", second.Outcomes)
	}
	for key, want := range map[string]int64{"boom": 10, "k": 7} {
		if r, err := l.Peek(ctx, key); err != nil || r.Remaining != want {
			t.Fatalf("%s after the chain: %+v %v, want %d left", key, r, err, want)
		}
	}
}

// When the next transaction of a chain cannot begin (its INSERT waited past
// insertGuard for another transaction's new row), the one before it still
// commits, and the next one runs again without the INSERT: the checks of
// rows it could not have are deferred, the others decided.
func TestChainWhenTheNextCannotBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := New(pool, Config{Prefix: "g", Capacity: 10, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := l.In(PgxTx(tx)).AllowN(ctx, "held", 1); err != nil { // a new row, not committed
		t.Fatal(err)
	}
	mk := func(key string) *engine.Request {
		cl, _, err := newCall(ctx, nil, []Charge{l.Charge(key, 1)})
		if err != nil {
			t.Fatal(err)
		}
		return cl.q
	}
	if _, err := l.Allow(ctx, "b"); err != nil { // a row that exists
		t.Fatal(err)
	}
	first, held, other := mk("a"), mk("held"), mk("b")
	links := []link{{ctx, planOf(t, l, []*engine.Request{first}, engine.SkipLocked)}, {ctx, planOf(t, l, []*engine.Request{held, other}, engine.SkipLocked)}}
	_, deferred, errs := chainOf(t, pool, links)
	if len(errs) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("errors %v", errs)
	}
	if !first.Allowed || len(deferred[0]) != 0 {
		t.Fatalf("first link: %+v, deferred %d", first.Outcomes, len(deferred[0]))
	}
	if len(deferred[1]) != 1 || deferred[1][0] != held || !other.Allowed || other.Outcomes[0].Remaining != 8 {
		t.Fatalf("second link: deferred %v, other %+v", deferred[1], other.Outcomes)
	}
}

// When a transaction's COMMIT fails in a chain with an error that trying
// again cures (here a deferred trigger's serialization failure, once), it is
// tried again, waiting for its rows, and the next one, which shares its row,
// follows it: both decided, in order, as one by one (issue 40: a chained
// batch's COMMIT error reached its callers).
func TestChainRetriesAFailedCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if onCitus(t, pool) {
		t.Skip("a trigger on a distributed table needs citus.enable_unsafe_triggers")
	}
	l, err := New(pool, Config{Prefix: "r", Capacity: 10, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "flaky"); err != nil { // the row exists (its INSERT is not what fails)
		t.Fatal(err)
	}
	for _, ddl := range []string{
		`CREATE SEQUENCE flaky_once`,
		`CREATE FUNCTION flaky() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF nextval('flaky_once') = 1 THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER flaky AFTER UPDATE ON pgratelimit_buckets DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.key = 'flaky') EXECUTE FUNCTION flaky()`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(key string, cost int64) *engine.Request {
		cl, _, err := newCall(ctx, nil, []Charge{l.Charge(key, cost)})
		if err != nil {
			t.Fatal(err)
		}
		return cl.q
	}
	first, second, other := mk("flaky", 3), mk("flaky", 2), mk("k", 1)
	links := []link{{ctx, planOf(t, l, []*engine.Request{first}, engine.SkipLocked)}, {ctx, planOf(t, l, []*engine.Request{second, other}, engine.SkipLocked)}}
	order, deferred, errs := chainOf(t, pool, links)
	if len(errs) != 2 || errs[0] != nil || errs[1] != nil || order[0] != links[0].p || len(deferred[0])+len(deferred[1]) != 0 {
		t.Fatalf("errors %v, deferred %v", errs, deferred)
	}
	if !first.Allowed || first.Outcomes[0].Remaining != 6 || !second.Allowed || second.Outcomes[0].Remaining != 4 || !other.Allowed {
		t.Fatalf("outcomes: first %+v, second %+v, other %+v", first.Outcomes, second.Outcomes, other.Outcomes)
	}
	if r, err := l.Peek(ctx, "flaky"); err != nil || r.Remaining != 4 {
		t.Fatalf("flaky after the chain: %+v %v, want 4 left", r, err)
	}
}

// Every array lock and relock, in every variant (with the leases column,
// the overrides, the grants), returns each row's ctid just before the
// clock, and the locks return each row's position first: the columns the
// engine scans (lockCols) in its order.
func TestArrayLockColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if onCitus(t, pool) {
		t.Skip("distributed tables take one-row statements only")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []Storage{Durable, Ephemeral} {
		base := &s.statements().Many
		tables := map[string]*sqlgen.Table{"plain": base, "data": base.Data, "overrides": base.Overrides, "data+overrides": base.Data.Overrides}
		for name, tab := range tables {
			for _, st := range []struct {
				name, sql string
				lock      bool
			}{
				{"lock", tab.Lock, true}, {"lockSkip", tab.LockSkip, true}, {"lockGrants", tab.LockGrants, true},
				{"lockSkipGrants", tab.LockSkipGrants, true}, {"relock", tab.Relock, false}, {"relockGrants", tab.RelockGrants, false},
			} {
				sd, err := conn.Conn().Prepare(ctx, "", st.sql)
				if err != nil {
					t.Fatalf("%v %s %s: %v", s, name, st.name, err)
				}
				var cols []string
				for _, f := range sd.Fields {
					cols = append(cols, f.Name)
				}
				at := slices.Index(cols, "ctid")
				first := "prefix"
				if st.lock {
					first = "i"
				}
				if at < 0 || at+1 == len(cols) || (cols[at+1] != "coalesce" && cols[at+1] != "clock") || cols[0] != first {
					t.Errorf("%v %s %s: columns %v, want %s first and the ctid just before the clock", s, name, st.name, cols, first)
				}
				if grants := strings.HasSuffix(st.name, "Grants"); grants != slices.Equal(cols[len(cols)-4:], []string{"id", "amount", "expires_at", "ledger"}) {
					t.Errorf("%v %s %s: columns %v, grants %v", s, name, st.name, cols, grants)
				}
			}
		}
	}
}

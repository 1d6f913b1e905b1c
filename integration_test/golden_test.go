package integration

// Golden statements: what the library sends for typical operations, byte
// for byte, recorded by a pgx tracer on the pool and compared with
// testdata/golden/statements.txt. A change of the library's layout must
// not change what it sends; a change of what it sends updates the file
// (go test -run TestGoldenStatements -update) and shows in review.

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// recorder is a pgx tracer that writes down every statement and its
// arguments, batch by batch.
type recorder struct {
	mu    sync.Mutex
	lines []string
	on    bool
	// policies records the statement that records a limiter's policy, once
	// per process at its first operation: shown by a step of its own, not
	// in every step that makes a limiter's first operation.
	policies bool
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on && (r.policies || !strings.Contains(format+fmt.Sprint(args...), `"pgratelimit_policies"`)) {
		r.lines = append(r.lines, fmt.Sprintf(format, args...))
	}
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add("query: %s%s", d.SQL, argList(d.Args))
	return ctx
}
func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.add("-- batch")
	return ctx
}
func (r *recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add("%s%s", d.SQL, argList(d.Args))
}
func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// argList formats statement arguments: times in UTC, ctids by their count.
func argList(args []any) string {
	if len(args) == 0 {
		return ""
	}
	parts := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case time.Time:
			parts[i] = v.UTC().Format(time.RFC3339Nano)
		case nil:
			parts[i] = "NULL"
		default:
			if v := reflect.ValueOf(a); v.Kind() == reflect.Slice && v.Type().Elem() == reflect.TypeFor[pgtype.TID]() {
				parts[i] = fmt.Sprintf("%d ctids", v.Len()) // where the rows lie on disk: not the statements'
				break
			}
			parts[i] = fmt.Sprintf("%#v", v)
		}
	}
	return "\n    args: " + strings.Join(parts, ", ")
}

func TestGoldenStatements(t *testing.T) {
	if perCheck {
		t.Skip("the golden run sets each limiter's mode itself; once is enough")
	}
	skipOnDistributed(t, "it records plain PostgreSQL's statements (Dialect Postgres); docs/citus.md's suite covers Citus's")
	ctx := context.Background()
	s := testdb.NewSchema(t)
	cfg := s.Config.Copy()
	rec := &recorder{}
	cfg.ConnConfig.Tracer = rec
	cfg.MaxConns = 4
	pool := s.PoolWithConfig(t, cfg)
	clock := func() time.Time { return t0 }
	step := func(name string, f func()) {
		rec.mu.Lock()
		rec.on = true
		rec.lines = append(rec.lines, "", "== "+name)
		rec.mu.Unlock()
		f()
		rec.mu.Lock()
		rec.on = false
		rec.mu.Unlock()
	}
	client, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{})
	require.NoError(t, err)
	mk := func(c pgratelimit.Config) *pgratelimit.Limiter {
		c.Clock = clock
		l, err := client.NewLimiter(c)
		require.NoError(t, err)
		return l
	}
	one := mk(pgratelimit.Config{Prefix: "one", Capacity: 10, Refill: 1, Interval: time.Second, DisableCoalescing: true})
	batch := mk(pgratelimit.Config{Prefix: "batch", Capacity: 10, Refill: 1, Interval: time.Second})
	eph := mk(pgratelimit.Config{Prefix: "eph", Capacity: 10, Refill: 1, Interval: time.Second, Storage: pgratelimit.Ephemeral, DisableCoalescing: true})
	money := mk(pgratelimit.Config{Prefix: "money", Capacity: 100, Refill: 100, Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		Grants: true, Ledger: true, DisableCoalescing: true, LockTimeout: time.Second})
	ok := func(_ any, err error) { t.Helper(); require.NoError(t, err) }
	id := func(s string) context.Context { return pgratelimit.WithRequestID(ctx, s) }

	step("a check of a new key, per check", func() { ok(one.AllowN(ctx, "k", 1)) })
	step("the same key again", func() { ok(one.AllowN(ctx, "k", 2)) })
	step("a check through the coalescer, alone (a batch of one)", func() { ok(batch.AllowN(ctx, "k", 1)) })
	step("ephemeral storage", func() { ok(eph.AllowN(ctx, "k", 1)) })
	step("AllowAll over two keys", func() {
		ok(pgratelimit.AllowAll(ctx, one.Charge("a", 1), eph.Charge("b", 1)))
	})
	step("AllowAll over six keys (arrays)", func() {
		var cs []pgratelimit.Charge
		for i := range 6 {
			cs = append(cs, one.Charge(fmt.Sprintf("m%d", i), 1))
		}
		ok(pgratelimit.AllowAll(ctx, cs...))
	})
	step("a grant with a request ID", func() { ok(money.Grant(id("pay-1"), "c", 50, t0.Add(time.Hour))) })
	step("a charge with a request ID that spends grants", func() { ok(money.AllowN(id("r1"), "c", 120)) })
	step("its replay", func() { ok(money.AllowN(id("r1"), "c", 120)) })
	step("its settlement", func() { ok(money.Settle(ctx, "c", "r1", 100)) })
	step("a debit", func() { ok(money.Debit(ctx, "c", 40)) })
	step("a refund with a request ID", func() { ok(money.Refund(id("ref-1"), "c", 5)) })
	step("peek", func() { ok(money.Peek(ctx, "c")) })
	step("grants", func() { ok(money.Grants(ctx, "c")) })
	step("ledger", func() { ok(money.Ledger(ctx, "c", time.Time{})) })
	step("reset", func() { require.NoError(t, money.Reset(ctx, "c")) })
	step("a check in the caller's pgx transaction", func() {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		ok(one.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "tx", 1))
		require.NoError(t, tx.Commit(ctx))
	})
	step("a check in the caller's database/sql transaction", func() {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		tx, err := db.BeginTx(ctx, &sql.TxOptions{})
		require.NoError(t, err)
		ok(one.In(pgratelimit.SQLTx(tx)).AllowN(ctx, "sqltx", 1))
		require.NoError(t, tx.Commit())
	})
	step("cleanup", func() { ok(deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock})) })

	// Limits as data (steps added after the others, which they leave as
	// they were: a limiter without Config.Overrides sends what it sent).
	rec.mu.Lock()
	rec.policies = true
	rec.mu.Unlock()
	over := mk(pgratelimit.Config{Prefix: "over", Capacity: 10, Refill: 1, Interval: time.Second, DisableCoalescing: true,
		Overrides: true, Ledger: true})
	overBatch := mk(pgratelimit.Config{Prefix: "over", Capacity: 10, Refill: 1, Interval: time.Second, Overrides: true})
	step("a limiter's first operation records its policy; then it sets an override (Overrides, Ledger)", func() {
		ok(over.SetOverride(ctx, "k", pgratelimit.Override{Capacity: 100, Refill: 5, Until: t0.Add(time.Hour), Note: "trial"}))
	})
	step("a check with Overrides, per check", func() { ok(over.AllowN(ctx, "k", 50)) })
	step("a check with Overrides through the coalescer (its policy recorded first)", func() { ok(overBatch.AllowN(ctx, "k", 1)) })
	step("AllowAll with Overrides over six keys (arrays)", func() {
		var cs []pgratelimit.Charge
		for i := range 6 {
			cs = append(cs, over.Charge(fmt.Sprintf("m%d", i), 1))
		}
		ok(pgratelimit.AllowAll(ctx, cs...))
	})
	step("peek with Overrides", func() { ok(over.Peek(ctx, "k")) })
	step("clear an override", func() { ok(over.ClearOverride(ctx, "k")) })
	require.NoError(t, client.Close(ctx))

	got := strings.Join(rec.lines, "\n") + "\n"
	got = strings.ReplaceAll(got, s.Name, "SCHEMA")
	compareGolden(t, "statements.txt", got)
}

// compareGolden compares got with testdata/golden/name, or rewrites it with
// -update.
func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file: run go test -run %s -update", t.Name())
	if string(want) == got {
		return
	}
	w, g := strings.Split(string(want), "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(i-8, 0)
	t.Fatalf("what the library sends changed at line %d of %s (go test -run %s -update rewrites it):\n--- want\n%s\n--- got\n%s",
		i+1, path, t.Name(), strings.Join(w[from:min(i+8, len(w))], "\n"), strings.Join(g[from:min(i+8, len(g))], "\n"))
}

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// A clock tests move.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func mustResult(t *testing.T, r Result, err error, limit, remaining int64) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if r.Limit != limit || r.Remaining != remaining {
		t.Fatalf("got %d of %d, want %d of %d", r.Remaining, r.Limit, remaining, limit)
	}
}

func TestOverrideArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	clock := &testClock{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	off, err := New(pool, Config{Prefix: "p", Capacity: 10, Refill: 1, Interval: time.Second, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.SetOverride(ctx, "k", Override{Capacity: 5, Refill: 1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("SetOverride without Config.Overrides: %v", err)
	}
	if _, err := off.ClearOverride(ctx, "k"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ClearOverride without Config.Overrides: %v", err)
	}
	on, err := New(pool, Config{Prefix: "p", Capacity: 10, Refill: 1, Interval: time.Second, Clock: clock.Now, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Override{
		"capacity 0":      {Capacity: 0, Refill: 1},
		"refill 0":        {Capacity: 1, Refill: 0},
		"negative":        {Capacity: -5, Refill: 1},
		"until now":       {Capacity: 1, Refill: 1, Until: clock.Now()},
		"until past":      {Capacity: 1, Refill: 1, Until: clock.Now().Add(-time.Hour)},
		"until year 10k":  {Capacity: 1, Refill: 1, Until: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"note too long":   {Capacity: 1, Refill: 1, Note: strings.Repeat("x", maxOverrideNote+1)},
		"note not UTF-8":  {Capacity: 1, Refill: 1, Note: "\xff"},
		"note with a NUL": {Capacity: 1, Refill: 1, Note: "a\x00b"},
	} {
		if _, err := on.SetOverride(ctx, "k", o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := on.SetOverride(ctx, "", Override{Capacity: 1, Refill: 1}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := on.ClearOverride(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	// The longest note is fine, and nothing above was written.
	r, err := on.SetOverride(ctx, "k", Override{Capacity: 3, Refill: 1, Note: strings.Repeat("x", maxOverrideNote)})
	mustResult(t, r, err, 3, 3)
}

// A raised override adds the difference at once, a lowered one clamps, with
// the ledger's plan rows; clearing falls back to the policy at the next
// operation that locks the row; a limiter without Overrides on the same
// prefix ignores it.
func TestOverridePlanChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	clock := &testClock{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{Prefix: "plans", Capacity: 10, Refill: 1, Interval: time.Hour, Clock: clock.Now, Ledger: true, Overrides: true}
	l, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.AllowN(ctx, "k", 8)
	mustResult(t, r, err, 10, 2)
	r, err = l.SetOverride(ctx, "k", Override{Capacity: 100, Refill: 10, Note: "enterprise trial"})
	mustResult(t, r, err, 100, 92)
	r, err = l.AllowN(ctx, "k", 50)
	mustResult(t, r, err, 100, 42)
	r, err = l.Peek(ctx, "k")
	mustResult(t, r, err, 100, 42)

	// A limiter without Overrides on the prefix decides with its own policy
	// (a plan change of its own: it clamps).
	plain, err := New(pool, Config{Prefix: "plans", Capacity: 10, Refill: 1, Interval: time.Hour, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	r, err = plain.Peek(ctx, "k")
	mustResult(t, r, err, 10, 10)

	// Refills follow the override's Refill; a plan change applies as of the
	// last write (42 clamped to 20), then the refills.
	clock.Add(time.Hour)
	r, err = l.Peek(ctx, "k")
	mustResult(t, r, err, 100, 52)

	r, err = l.SetOverride(ctx, "k", Override{Capacity: 20, Refill: 10})
	mustResult(t, r, err, 20, 20)
	r, err = l.ClearOverride(ctx, "k")
	mustResult(t, r, err, 10, 10) // as Peek: the policy's, not written yet
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 10, 9)
	r, err = l.ClearOverride(ctx, "k") // again: nothing to clear
	mustResult(t, r, err, 10, 9)

	es, err := l.Ledger(ctx, "k", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Kind+" "+strconv.FormatInt(e.Amount, 10)+" = "+strconv.FormatInt(e.Balance, 10))
	}
	want := []string{"charge -8 = 2", "plan 90 = 92", "charge -50 = 42", "plan -22 = 20", "plan -10 = 10", "charge -1 = 9"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("ledger:\n got %v\nwant %v", got, want)
	}
}

// An override ends at Until by the checks' clock: the policy applies again.
func TestOverrideUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	clock := &testClock{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	l, err := New(pool, Config{Prefix: "until", Capacity: 10, Refill: 10, Interval: 24 * time.Hour, Clock: clock.Now, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.SetOverride(ctx, "k", Override{Capacity: 1000, Refill: 1000, Until: clock.Now().Add(time.Hour)})
	mustResult(t, r, err, 1000, 1000)
	r, err = l.AllowN(ctx, "k", 500)
	mustResult(t, r, err, 1000, 500)
	clock.Add(time.Hour - time.Microsecond)
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 1000, 499)
	clock.Add(time.Microsecond) // Until: the override has ended
	r, err = l.Peek(ctx, "k")
	mustResult(t, r, err, 10, 10)
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 10, 9)
}

// A row whose copy of its override is unknown (a row made since, or before
// the copy existed) is decided under the override as read after its lock,
// to the microsecond of its Until, and an allowed check writes the copy.
func TestOverrideUnknownCopyUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	clock := &testClock{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	l, err := New(pool, Config{Prefix: "unknown-until", Capacity: 10, Refill: 10, Interval: 24 * time.Hour, Clock: clock.Now, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	until := clock.Now().Add(time.Hour + 123456*time.Microsecond)
	r, err := l.SetOverride(ctx, "k", Override{Capacity: 1000, Refill: 1000, Until: until})
	mustResult(t, r, err, 1000, 1000)
	forget := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE pgratelimit_buckets SET ov_capacity = -1, ov_refill = NULL, ov_until = NULL WHERE prefix = 'unknown-until'`); err != nil {
			t.Fatal(err)
		}
	}
	copyOf := func() (c *int64, u *time.Time) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT ov_capacity, ov_until FROM pgratelimit_buckets WHERE prefix = 'unknown-until' AND key = 'k'`).Scan(&c, &u); err != nil {
			t.Fatal(err)
		}
		return c, u
	}
	forget()
	r, err = l.AllowN(ctx, "k", 500)
	mustResult(t, r, err, 1000, 500)
	if c, u := copyOf(); c == nil || *c != 1000 || u == nil || !u.Equal(until) {
		t.Fatalf("the copy written after the check: %v, %v; want 1000 until %v", c, u, until)
	}
	forget()
	clock.Add(until.Add(-time.Microsecond).Sub(clock.Now()))
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 1000, 499)
	forget()
	clock.Add(time.Microsecond) // Until: the override has ended
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 10, 9)
}

// A limiter's first check in the caller's transaction learns the
// database's dialect through that transaction, not through the pool: here
// the transaction holds the pool's only connection, and a limiter with
// Overrides (whose statements are the dialect's) decides at once rather
// than waiting for a connection until its context ends. A client that has
// not checked on its pool yet does so first: Citus refuses plain
// PostgreSQL's lateral join of the grants (In(tx).Grant).
func TestFirstCheckInTxAsksThroughTx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testdb.NewSchema(t).Pool(t, 1)
	for _, ov := range []bool{true, false} {
		l, err := New(pool, Config{Prefix: fmt.Sprintf("first-%v", ov), Capacity: 10, Refill: 1, Interval: time.Hour, Overrides: ov})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) }) // a failed test's: the pool's Close waits for it
		r, err := l.In(PgxTx(tx)).AllowN(ctx, "k", 4)
		mustResult(t, r, err, 10, 6)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r, err = l.Peek(ctx, "k")
		mustResult(t, r, err, 10, 6)
	}
	// The policies were recorded all the same, once the pool had a
	// connection free.
	for {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlgen.PoliciesTable+` WHERE prefix LIKE 'first-%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d policies recorded, want 2", n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SetOverride and ClearOverride in the caller's transaction: written only
// if it commits.
func TestOverrideInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := New(pool, Config{Prefix: "tx", Capacity: 10, Refill: 1, Interval: time.Hour, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // a failed test's: the pool's Close waits for it
	r, err := l.In(PgxTx(tx)).SetOverride(ctx, "k", Override{Capacity: 50, Refill: 1})
	mustResult(t, r, err, 50, 50)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = l.Peek(ctx, "k")
	mustResult(t, r, err, 10, 10)

	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	r, err = l.In(PgxTx(tx)).SetOverride(ctx, "k", Override{Capacity: 50, Refill: 1})
	mustResult(t, r, err, 50, 50)
	r, err = l.In(PgxTx(tx)).AllowN(ctx, "k", 40)
	mustResult(t, r, err, 50, 10)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = l.AllowN(ctx, "k", 5)
	mustResult(t, r, err, 50, 5)

	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	r, err = l.In(PgxTx(tx)).ClearOverride(ctx, "k")
	mustResult(t, r, err, 10, 5)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = l.Peek(ctx, "k")
	mustResult(t, r, err, 50, 5)
}

// The checks of a batch (coalesced, arrays) read each key's override.
func TestOverrideInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	clock := &testClock{now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}
	l, err := New(pool, Config{Prefix: "batch", Capacity: 10, Refill: 1, Interval: time.Hour, Clock: clock.Now, Overrides: true, Grants: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k3", "k5"} {
		if _, err := l.SetOverride(ctx, k, Override{Capacity: 100, Refill: 1}); err != nil {
			t.Fatal(err)
		}
	}
	var cs []Charge
	for _, k := range []string{"k0", "k1", "k2", "k3", "k4", "k5"} {
		cs = append(cs, l.Charge(k, 10))
	}
	m, err := AllowAll(ctx, cs...) // six rows: the array statements
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range m.Results {
		want := int64(0)
		if i%2 == 1 {
			want = 90
		}
		if r.Remaining != want {
			t.Errorf("%s: %d left, want %d", cs[i].key, r.Remaining, want)
		}
	}
}

// A key's bucket row carries its override, and a row made again (its copy
// unknown) is decided under it too: after Reset deleted it (one row, and rows of a batch, the array
// statements), and after a crash emptied the ephemeral table (TRUNCATE
// stands in for it).
func TestOverrideOutlivesItsRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	for _, s := range []Storage{Durable, Ephemeral} {
		t.Run(s.String(), func(t *testing.T) {
			l, err := New(pool, Config{Prefix: "gone-" + s.String(), Capacity: 10, Refill: 1, Interval: time.Hour, Storage: s, Overrides: true})
			if err != nil {
				t.Fatal(err)
			}
			keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
			for _, k := range []string{"k1", "k3"} {
				r, err := l.SetOverride(ctx, k, Override{Capacity: 100, Refill: 1})
				mustResult(t, r, err, 100, 100)
			}
			r, err := l.AllowN(ctx, "k1", 30)
			mustResult(t, r, err, 100, 70)

			// Reset deletes the row: full again, under the override.
			if err := l.Reset(ctx, "k1"); err != nil {
				t.Fatal(err)
			}
			r, err = l.AllowN(ctx, "k1", 30)
			mustResult(t, r, err, 100, 70)

			// Rows deleted, then made again by a batch.
			for _, k := range keys {
				if err := l.Reset(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			batch := func() {
				t.Helper()
				var cs []Charge
				for _, k := range keys {
					cs = append(cs, l.Charge(k, 10))
				}
				m, err := AllowAll(ctx, cs...)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range m.Results {
					limit, left := int64(10), int64(0)
					if keys[i] == "k1" || keys[i] == "k3" {
						limit, left = 100, 90
					}
					if r.Limit != limit || r.Remaining != left {
						t.Errorf("%s: %d of %d left, want %d of %d", keys[i], r.Remaining, r.Limit, left, limit)
					}
				}
			}
			batch()

			if s == Ephemeral {
				// A crash empties the unlogged table: the overrides come back.
				if _, err := pool.Exec(ctx, `TRUNCATE pgratelimit_ephemeral_buckets`); err != nil {
					t.Fatal(err)
				}
				batch()
				if _, err := pool.Exec(ctx, `TRUNCATE pgratelimit_ephemeral_buckets`); err != nil {
					t.Fatal(err)
				}
				r, err = l.AllowN(ctx, "k3", 1)
				mustResult(t, r, err, 100, 99)
			}
		})
	}
}

// Limiters of both storages on one prefix share its keys' overrides:
// SetOverride and ClearOverride through either one write the rows of both
// tables (the other's made where it has none; a row made later reads the
// override after its lock).
func TestOverrideBothStorages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var ls [2]*Limiter
	for i, s := range []Storage{Durable, Ephemeral} {
		l, err := New(pool, Config{Prefix: "both", Capacity: 10, Refill: 1, Interval: time.Hour, Storage: s, Overrides: true})
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	dur, eph := ls[0], ls[1]
	r, err := eph.AllowN(ctx, "k", 4) // the ephemeral row exists, the other's set writes it
	mustResult(t, r, err, 10, 6)
	r, err = dur.SetOverride(ctx, "k", Override{Capacity: 50, Refill: 1})
	mustResult(t, r, err, 50, 50)
	r, err = eph.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 50, 45) // 6 raised by 40, then 1 spent

	r, err = eph.SetOverride(ctx, "j", Override{Capacity: 20, Refill: 1}) // no durable row yet
	mustResult(t, r, err, 20, 20)
	r, err = dur.AllowN(ctx, "j", 1)
	mustResult(t, r, err, 20, 19)

	r, err = eph.ClearOverride(ctx, "k") // the durable row's too
	mustResult(t, r, err, 10, 10)
	r, err = dur.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 10, 9)
	r, err = dur.ClearOverride(ctx, "j")
	mustResult(t, r, err, 10, 10)
	r, err = eph.AllowN(ctx, "j", 1)
	mustResult(t, r, err, 10, 9)
}

// A transaction whose snapshot predates an override cannot read the older
// override for a row of the key made after it: SetOverride made the key's
// rows of both tables, so the transaction's INSERT meets the row it cannot
// see (REPEATABLE READ: a serialization failure; READ COMMITTED: it waits
// for the override's commit and locks the row with its copy), and every
// later check sees the override.
func TestOverrideOlderSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	citus := onCitus(t, pool)
	var ls [2]*Limiter
	for i, s := range []Storage{Durable, Ephemeral} {
		l, err := New(pool, Config{Prefix: "snap", Capacity: 10, Refill: 1, Interval: time.Hour, Storage: s, Overrides: true})
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	for i, l := range ls {
		other := ls[1-i]
		key := "k" + strconv.Itoa(i)
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the snapshot
			t.Fatal(err)
		}
		r, err := other.SetOverride(ctx, key, Override{Capacity: 50, Refill: 1})
		mustResult(t, r, err, 50, 50)
		r, err = l.In(PgxTx(tx)).AllowN(ctx, key, 1)
		var pgErr *pgconn.PgError
		switch {
		case citus:
			// The coordinator's snapshot is not the worker's: the worker's
			// transaction, and its snapshot, begin with the check's first
			// statement there, after the override's commit.
			mustResult(t, r, err, 50, 49)
		case !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.SerializationFailure:
			t.Fatalf("a check in a transaction older than the override: %v, want a serialization failure", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		r, err = l.AllowN(ctx, key, 1)
		mustResult(t, r, err, 50, 49)
	}
}

// ovCopy reads the copy of its key's override that a bucket row carries:
// its ov_capacity (-1: unknown; 0: none, NULL in the row).
func ovCopy(t *testing.T, pool *pgxpool.Pool, table, prefix, key string) int64 {
	t.Helper()
	var c int64
	if err := pool.QueryRow(context.Background(), `SELECT COALESCE(ov_capacity, 0) FROM `+table+` WHERE prefix = $1 AND key = $2`, prefix, key).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// A row whose copy of its key's override is unknown (ov_capacity -1: a row
// a limiter without Overrides made, or set so by hand) is decided under the
// key's override, read after the row's lock; an allowed check writes the
// copy, a denied one writes nothing. A limiter without Overrides leaves the
// copy as it is.
func TestOverrideUnknownCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	for _, s := range []Storage{Durable, Ephemeral} {
		t.Run(s.String(), func(t *testing.T) {
			table := "pgratelimit_buckets"
			if s == Ephemeral {
				table = "pgratelimit_ephemeral_buckets"
			}
			prefix := "unknown-" + s.String()
			// On Citus checks read the key's override in a statement of
			// their own, not the copy, and write no copy.
			citus := onCitus(t, pool)
			wantCopy := func(key string, want int64, when string) {
				t.Helper()
				if c := ovCopy(t, pool, table, prefix, key); !citus && c != want {
					t.Fatalf("copy of %s %s: %d, want %d", key, when, c, want)
				}
			}
			on, err := New(pool, Config{Prefix: prefix, Capacity: 10, Refill: 1, Interval: time.Hour, Storage: s, Overrides: true})
			if err != nil {
				t.Fatal(err)
			}
			off, err := New(pool, Config{Prefix: prefix, Capacity: 10, Refill: 1, Interval: time.Hour, Storage: s})
			if err != nil {
				t.Fatal(err)
			}
			r, err := on.SetOverride(ctx, "a", Override{Capacity: 100, Refill: 1})
			mustResult(t, r, err, 100, 100)
			wantCopy("a", 100, "after SetOverride")

			// The row made again by a limiter without Overrides: unknown,
			// and its checks leave it so.
			if err := off.Reset(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			r, err = off.AllowN(ctx, "a", 1)
			mustResult(t, r, err, 10, 9)
			wantCopy("a", -1, "in a row a limiter without Overrides made")
			// Resolved by the lock: 9 raised by 90, 1 spent; now known.
			r, err = on.AllowN(ctx, "a", 1)
			mustResult(t, r, err, 100, 98)
			wantCopy("a", 100, "after an allowed check")
			// A limiter without Overrides leaves a known copy alone.
			r, err = off.AllowN(ctx, "a", 1)
			mustResult(t, r, err, 10, 9) // its own policy clamps the bucket
			wantCopy("a", 100, "after a check without Overrides")
			r, err = on.AllowN(ctx, "a", 1)
			mustResult(t, r, err, 100, 98)

			// The table is the truth: an override the copy does not know
			// (written by hand), read for an unknown row. A denied check
			// writes nothing, the row stays unknown; an allowed one
			// writes the copy.
			if _, err := pool.Exec(ctx, `INSERT INTO pgratelimit_overrides (prefix, key, capacity, refill) VALUES ($1, 'b', 5, 1)`, prefix); err != nil {
				t.Fatal(err)
			}
			r, err = on.AllowN(ctx, "b", 6) // a new row, more than the override's capacity
			if err != nil || r.Allowed || r.Limit != 5 {
				t.Fatalf("6 of an override of 5: %+v, %v", r, err)
			}
			wantCopy("b", -1, "after a denied check")
			r, err = on.AllowN(ctx, "b", 2)
			mustResult(t, r, err, 5, 3)
			wantCopy("b", 5, "after an allowed check")
			if _, err := pool.Exec(ctx, `DELETE FROM pgratelimit_overrides WHERE prefix = $1 AND key = 'b'`, prefix); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `UPDATE `+table+` SET ov_capacity = -1 WHERE prefix = $1 AND key = 'b'`, prefix); err != nil {
				t.Fatal(err)
			}
			r, err = on.AllowN(ctx, "b", 1) // no override now: 3 clamped to 10's grid, as the policy
			if err != nil {
				t.Fatal(err)
			}
			if r.Limit != 10 {
				t.Fatalf("unknown row without an override: limit %d, want 10", r.Limit)
			}
			wantCopy("b", 0, "after an allowed check without an override")

			// A batch (the array statements) over unknown and known rows.
			keys := []string{"m0", "m1", "m2", "m3"}
			for _, k := range []string{"m1", "m2"} {
				r, err := on.SetOverride(ctx, k, Override{Capacity: 50, Refill: 1})
				mustResult(t, r, err, 50, 50)
			}
			if _, err := pool.Exec(ctx, `UPDATE `+table+` SET ov_capacity = -1 WHERE prefix = $1 AND key IN ('m1', 'm3')`, prefix); err != nil {
				t.Fatal(err)
			}
			var cs []Charge
			for _, k := range keys {
				cs = append(cs, on.Charge(k, 1))
			}
			m, err := AllowAll(ctx, cs...)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range m.Results {
				limit := int64(10)
				if keys[i] == "m1" || keys[i] == "m2" {
					limit = 50
				}
				if r.Limit != limit || r.Remaining != limit-1 {
					t.Errorf("%s: %d of %d left, want %d of %d", keys[i], r.Remaining, r.Limit, limit-1, limit)
				}
				want := int64(0)
				if limit == 50 {
					want = 50
				}
				if c := ovCopy(t, pool, table, prefix, keys[i]); !citus && c != want {
					t.Errorf("%s: copy %d after the batch, want %d", keys[i], c, want)
				}
			}
		})
	}
}

// The race the copy had when a new row's INSERT filled it: the INSERT's
// snapshot is taken, an override commits and the key's row is deleted
// (Reset), then the INSERT makes the row. A trigger holds the INSERT
// between its snapshot and the insertion (an advisory lock the test
// holds), so it happens every time: the new row is unknown, and the check
// reads the override committed meanwhile, after its lock.
func TestOverrideNewRowAfterItsSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if onCitus(t, pool) {
		t.Skip("a trigger on a distributed table needs citus.enable_unsafe_triggers")
	}
	l, err := New(pool, Config{Prefix: "race", Capacity: 10, Refill: 1, Interval: time.Hour, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.AllowN(ctx, "k", 1) // the row exists, no override
	mustResult(t, r, err, 10, 9)
	for _, ddl := range []string{
		`CREATE SEQUENCE race_gate`,
		// The first INSERT of the key's row from now on waits for the
		// test's advisory lock; later ones (SetOverride's) pass.
		`CREATE FUNCTION race_wait() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('race_gate') = 1 THEN
        PERFORM pg_advisory_xact_lock_shared(4242);
    END IF;
    RETURN NEW;
END $$`,
		`CREATE TRIGGER race_wait BEFORE INSERT ON pgratelimit_buckets FOR EACH ROW WHEN (NEW.key = 'k') EXECUTE FUNCTION race_wait()`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	gate, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			_, _ = gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
		}
	}()

	// The check, in a READ COMMITTED transaction of its own (no
	// lock_timeout): its INSERT waits in the trigger.
	type result struct {
		r   Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		r, err := l.In(PgxTx(tx)).AllowN(ctx, "k", 1)
		if err == nil {
			err = tx.Commit(ctx)
		}
		done <- result{r, err}
	}()
	for waiting := false; !waiting; {
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			t.Fatalf("the check ended before its INSERT waited: %+v", res)
		default:
		}
	}

	// Meanwhile: the override commits, then the row is deleted.
	r, err = l.SetOverride(ctx, "k", Override{Capacity: 100, Refill: 1})
	mustResult(t, r, err, 100, 99)
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	released = true
	res := <-done
	mustResult(t, res.r, res.err, 100, 99) // a new row, full under the override
	if c := ovCopy(t, pool, "pgratelimit_buckets", "race", "k"); c != 100 {
		t.Fatalf("after the check: %d, want 100", c)
	}
	r, err = l.AllowN(ctx, "k", 1)
	mustResult(t, r, err, 100, 98)
}

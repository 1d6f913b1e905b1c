package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// A limiter of NewMemoryClient answers every operation as one on the
// database does, on the same clock: a random walk of checks, AllowAll,
// refunds, grants, debits, settlements (with request IDs repeated), resets
// and peeks, compared step by step, then the ledgers.
func TestMemoryMatchesDatabase(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cfgs := []Config{
		{Prefix: "m", Capacity: 20, Refill: 3, Interval: time.Minute, Clock: clock, Grants: true, Ledger: true},
		{Prefix: "m", Capacity: 35, Refill: 5, Interval: time.Minute, Clock: clock, Grants: true, Ledger: true}, // a bigger plan
		{Prefix: "day", Capacity: 50, Refill: 50, Calendar: Calendar{Every: Day}, Clock: clock},
	}
	pool := testdb.Pool(t)
	mem := NewMemoryClient()
	var db, mm []*Limiter
	for _, cfg := range cfgs {
		cfg.DisableCoalescing = true
		l, err := New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		m, err := mem.NewLimiter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db, mm = append(db, l), append(mm, m)
	}
	rng := rand.New(rand.NewPCG(3, 7))
	keys := []string{"a", "b"}
	answered := map[int]int{} // operations answered without an error, by kind
	for step := range 400 {
		now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
		i, key := rng.IntN(2), keys[rng.IntN(2)]
		id := fmt.Sprintf("r%d", rng.IntN(30))
		n := 1 + rng.Int64N(25)
		exp := now.Add(time.Duration(rng.IntN(3)) * time.Hour) // a grant's: now is in the past
		var op func(l, day *Limiter) (any, error)
		kind := rng.IntN(9)
		switch kind {
		case 0, 1:
			op = func(l, _ *Limiter) (any, error) { return l.AllowN(WithRequestID(ctx, id), key, n) }
		case 2:
			op = func(l, day *Limiter) (any, error) {
				return AllowAll(ctx, l.Charge(key, n), day.Charge(key, n))
			}
		case 3:
			op = func(l, _ *Limiter) (any, error) { return l.Refund(ctx, key, n) }
		case 4:
			op = func(l, _ *Limiter) (any, error) {
				return l.Grant(WithRequestID(ctx, "g"+id), key, n, exp)
			}
		case 5:
			op = func(l, _ *Limiter) (any, error) { return l.Debit(WithRequestID(ctx, id), key, n) }
		case 6:
			op = func(l, _ *Limiter) (any, error) { return l.Settle(ctx, key, id, n) }
		case 7:
			op = func(l, _ *Limiter) (any, error) { return nil, l.Reset(ctx, key) }
		default:
			op = func(l, _ *Limiter) (any, error) { return l.Peek(ctx, key) }
		}
		want, werr := op(db[i], db[2])
		got, gerr := op(mm[i], mm[2])
		if (werr == nil) != (gerr == nil) || werr != nil && !sameError(werr, gerr) {
			t.Fatalf("step %d: database %v, memory %v", step, werr, gerr)
		}
		if g, ok := got.(Grant); ok {
			g.ID = want.(Grant).ID // IDs are the table's, or memory's own
			got = g
		}
		if werr == nil && fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("step %d: database %+v, memory %+v", step, want, got)
		}
		if werr == nil {
			answered[kind]++
		}
	}
	for kind := range 9 {
		if answered[kind] == 0 {
			t.Errorf("no operation of kind %d was answered: the walk compared only errors", kind)
		}
	}
	for _, key := range keys {
		want, err := db[0].Ledger(ctx, key, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := mm[0].Ledger(ctx, key, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != len(got) {
			t.Fatalf("key %s: %d ledger rows on the database, %d in memory", key, len(want), len(got))
		}
		for i := range want {
			same := want[i].At.Equal(got[i].At)
			want[i].ID, got[i].ID, want[i].At, got[i].At = 0, 0, time.Time{}, time.Time{}
			if !same || want[i] != got[i] {
				t.Fatalf("key %s, row %d: database %+v, memory %+v", key, i, want[i], got[i])
			}
		}
	}
}

// sameError says whether a and b are the same error of the API.
func sameError(a, b error) bool {
	for _, e := range []error{ErrInvalidArgument, ErrInvalidCost, ErrCostExceedsCapacity, ErrRequestMismatch, ErrUnknownRequest, ErrGrantExpired} {
		if errors.Is(a, e) != errors.Is(b, e) {
			return false
		}
	}
	return true
}

// What a memory client cannot do, it refuses: transactions, semaphores,
// alerts.
func TestMemoryRefuses(t *testing.T) {
	ctx := context.Background()
	c := NewMemoryClient()
	l, err := c.NewLimiter(Config{Prefix: "p", Capacity: 2, Refill: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.In(Tx{}).AllowN(ctx, "k", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("In: %v", err)
	}
	if _, err := l.In(Tx{}).Peek(ctx, "k"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("In, Peek: %v", err)
	}
	if _, err := c.NewSemaphore(SemaphoreConfig{Prefix: "s", Max: 1, TTL: time.Second}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewSemaphore: %v", err)
	}
	if _, err := c.NewLimiter(Config{Prefix: "a", Capacity: 2, Refill: 1, Interval: time.Second, Alerts: Alerts{Exhausted: true}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Alerts: %v", err)
	}
	if _, err := c.NewLimiter(Config{Prefix: "o", Capacity: 2, Refill: 1, Interval: time.Second, Overrides: true}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Overrides: %v", err)
	}
	other, err := NewMemoryClient().NewLimiter(Config{Prefix: "q", Capacity: 2, Refill: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AllowAll(ctx, l.Charge("k", 1), other.Charge("k", 1)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("two memory clients in one AllowAll: %v", err)
	}
	for range 2 {
		if r, err := l.AllowN(ctx, "k", 1); err != nil || !r.Allowed {
			t.Fatalf("%+v %v", r, err)
		}
	}
	if r, err := l.AllowN(ctx, "k", 1); err != nil || r.Allowed || r.RetryAfter <= 0 {
		t.Fatalf("a third: %+v %v", r, err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(ctx, "k", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

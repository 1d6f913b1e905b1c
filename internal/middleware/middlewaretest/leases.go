package middlewaretest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A call holds a lease of its key while its handler runs, extended past
// the TTL, released when it returns; a call that finds no free unit is
// denied with the semaphore's fields; exempt calls take no lease.
func testSemaphore(t *testing.T, d suite) {
	s := newSemaphore(t, testdb.Pool(t), pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 1, TTL: 300 * time.Millisecond})
	started, gate := make(chan struct{}, 1), make(chan struct{})
	handle := func(r Request) {
		if r.Get(blockField) != "" {
			started <- struct{}{}
			<-gate
		}
	}
	c, err := d.Serve(t, Config{KeyFunc: byKey, Semaphore: s, Exempt: func(r Request) bool { return r.Get(exemptField) != "" }}, handle)
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan Response, 1)
	go func() { slow <- c.Do(t, keyField, "a", blockField, "1") }()
	<-started
	first := leases(t, s, "a", 1)[0]
	until(t, s, "a", func(ls []pgratelimit.Lease) bool {
		return len(ls) == 1 && ls[0].ID == first.ID && ls[0].ExpiresAt.After(first.ExpiresAt)
	})
	want(t, "a second call", c.Do(t, keyField, "a"), Denied, `"conc";q=1`, `"conc";r=0`, "1")
	want(t, "an exempt call", c.Do(t, keyField, "a", exemptField, "1"), OK, "", "", "")
	want(t, "another key", c.Do(t, keyField, "b"), OK, `"conc";q=1`, `"conc";r=0`, "")
	close(gate)
	want(t, "the slow call", <-slow, OK, `"conc";q=1`, `"conc";r=0`, "")
	leases(t, s, "a", 0)
	want(t, "after the slow call", c.Do(t, keyField, "a"), OK, `"conc";q=1`, `"conc";r=0`, "")
	leases(t, s, "a", 0)
}

// A lease and a rate limit on one call: both policies in RateLimit-Policy,
// the lease's weight from Weight, taken together.
func testSemaphoreWithLimiter(t *testing.T, d suite) {
	pool := testdb.Pool(t)
	l := d.newLimiter(t, pool, pgratelimit.Config{Prefix: "api", Capacity: 10, Refill: 10, Interval: 10 * time.Second})
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 4, TTL: time.Minute})
	c := serve(t, d, Config{KeyFunc: byKey, Cost: byCost, Semaphore: s, Weight: func(Request) int64 { return 3 }}, l)
	want(t, "a call", c.Do(t, keyField, "a"), OK, `"api";q=10;w=10, "conc";q=4`, `"conc";r=1`, "")
	leases(t, s, "a", 0)
	// All or nothing: a call the limiter denies takes no lease.
	r := c.Do(t, keyField, "a", costField, "10")
	if r.Status != Denied || !strings.HasPrefix(r.RateLimit, `"api";`) {
		t.Fatalf("a call over the limit: %s, RateLimit %q, want the limiter's denial", r.Status, r.RateLimit)
	}
	if n := remaining(t, l, "a"); n != 9 {
		t.Fatalf("%d left, want 9", n)
	}
}

// Limiters picks a call's limiters from the call (a plan), in place of the
// limiters given; an error is the call's fault.
func testLimitersPerCall(t *testing.T, d suite) {
	pool := testdb.Pool(t)
	mk := func(prefix string, n int64) *pgratelimit.Limiter {
		return d.newLimiter(t, pool, pgratelimit.Config{Prefix: prefix, Capacity: n, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	}
	def := mk("default", 2)
	plans := map[string][]*pgratelimit.Limiter{"free": {mk("free", 1)}, "pro": {mk("pro", 5)}}
	pick := func(r Request, key string) ([]*pgratelimit.Limiter, error) {
		if ls, ok := plans[r.Get(planField)]; ok && key == "a" {
			return ls, nil
		}
		return nil, errors.New("no such plan")
	}
	for _, limiters := range [][]*pgratelimit.Limiter{{def}, nil} {
		c := serve(t, d, Config{KeyFunc: byKey, Limiters: pick}, limiters...)
		want(t, "free", c.Do(t, keyField, "a", planField, "free"), OK, `"free";q=1;w=10`, `"free";r=0;t=10`, "")
		want(t, "free again", c.Do(t, keyField, "a", planField, "free"), Denied, `"free";q=1;w=10`, `"free";r=0;t=10`, "10")
		want(t, "pro", c.Do(t, keyField, "a", planField, "pro"), OK, `"pro";q=5;w=50`, `"pro";r=4;t=10`, "")
		want(t, "no plan", c.Do(t, keyField, "a", planField, "gold"), Invalid, "", "", "")
		for _, ls := range plans {
			if err := ls[0].Reset(t.Context(), "a"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := remaining(t, def, "a"); n != 2 {
		t.Fatalf("the default limiter: %d left, want 2 (not charged)", n)
	}
}

// Several limiters are charged at once, all or nothing: RateLimit-Policy
// lists them all, RateLimit reports the one closest to denying, and a call
// one of them denies takes nothing of the others.
func testSeveralLimiters(t *testing.T, d suite) {
	pool := testdb.Pool(t)
	second := d.newLimiter(t, pool, pgratelimit.Config{Prefix: "second", Capacity: 2, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	day := d.newLimiter(t, pool, pgratelimit.Config{Prefix: "day", Capacity: 3, Refill: 1, Interval: time.Hour, Clock: fixed})
	c := serve(t, d, Config{KeyFunc: byKey}, second, day)
	policy := `"second";q=2;w=20, "day";q=3;w=10800`
	want(t, "first", c.Do(t, keyField, "a"), OK, policy, `"second";r=1;t=10`, "")
	want(t, "second", c.Do(t, keyField, "a"), OK, policy, `"second";r=0;t=20`, "")
	want(t, "third", c.Do(t, keyField, "a"), Denied, policy, `"second";r=0;t=20`, "10")
	if n := remaining(t, day, "a"); n != 1 {
		t.Fatalf("day: %d left, want 1 (the denied call took nothing)", n)
	}
}

// A Config that cannot check anything, a nil limiter, or a Weight without
// a Semaphore is refused when the adapter is built, with ErrInvalidConfig.
func testInvalidConfig(t *testing.T, d suite) {
	pool := testdb.Pool(t)
	l := d.newLimiter(t, pool, pgratelimit.Config{Prefix: "t", Capacity: 1, Refill: 1, Interval: time.Second})
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "s", Max: 1, TTL: time.Minute})
	weight := func(Request) int64 { return 1 }
	none := func(Request) {}
	for _, tc := range []struct {
		name     string
		cfg      Config
		limiters []*pgratelimit.Limiter
	}{
		{"nothing to check", Config{}, nil},
		{"a nil limiter", Config{}, []*pgratelimit.Limiter{l, nil}},
		{"a weight without a semaphore", Config{Weight: weight}, []*pgratelimit.Limiter{l}},
	} {
		if _, err := d.Serve(t, tc.cfg, none, tc.limiters...); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	for _, cfg := range []Config{{Semaphore: s, Weight: weight}, {Limiters: func(Request, string) ([]*pgratelimit.Limiter, error) { return nil, nil }}} {
		if _, err := d.Serve(t, cfg, none); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

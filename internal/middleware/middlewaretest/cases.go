package middlewaretest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// An allowed call reaches its handler with RateLimit-Policy and RateLimit,
// and takes its token.
func testAllowed(t *testing.T, d suite) {
	l := d.limiter(t, "t", 2, 10*time.Second)
	c := serve(t, d, Config{KeyFunc: byKey}, l)
	want(t, "first call", c.Do(t, keyField, "a"), OK, `"t";q=2;w=20`, `"t";r=1;t=10`, "")
	if n := remaining(t, l, "a"); n != 1 {
		t.Fatalf("%d left, want 1", n)
	}
}

// A denied call gets the fields, Retry-After in whole seconds and, where
// the protocol has it, the exact wait in RetryInfo; another key's bucket is
// its own.
func testDenied(t *testing.T, d suite) {
	l := d.limiter(t, "t", 1, 10*time.Second)
	c := serve(t, d, Config{KeyFunc: byKey}, l)
	want(t, "first call", c.Do(t, keyField, "a"), OK, `"t";q=1;w=10`, `"t";r=0;t=10`, "")
	r := c.Do(t, keyField, "a")
	want(t, "second call", r, Denied, `"t";q=1;w=10`, `"t";r=0;t=10`, "10")
	if r.HasRetryInfo && r.RetryDelay != 10*time.Second {
		t.Fatalf("RetryInfo's delay %s, want 10s", r.RetryDelay)
	}
	want(t, "another key", c.Do(t, keyField, "b"), OK, `"t";q=1;w=10`, `"t";r=0;t=10`, "")
}

// Without a KeyFunc, a call is keyed by its peer's address.
func testDefaultKey(t *testing.T, d suite) {
	l := d.limiter(t, "t", 5, time.Hour)
	c := serve(t, d, Config{}, l)
	if r := c.Do(t); r.Status != OK {
		t.Fatalf("%s (%s)", r.Status, r.Raw)
	}
	if n := remaining(t, l, d.PeerKey()); n != 4 {
		t.Fatalf("%s: %d left, want 4", d.PeerKey(), n)
	}
}

// A call without a key, whose limiters cannot be found, or whose cost
// pgratelimit refuses, is the call's fault (Invalid), spending nothing; in
// shadow mode it goes on, logged.
func testRefused(t *testing.T, d suite) {
	l := d.limiter(t, "t", 5, time.Hour)
	noPlan := func(Request, string) ([]*pgratelimit.Limiter, error) { return nil, errors.New("no such plan") }
	for _, tc := range []struct {
		name string
		cfg  Config
		kv   []string
	}{
		{"no key", Config{KeyFunc: byKey}, nil},
		{"no limiters", Config{KeyFunc: byKey, Limiters: noPlan}, []string{keyField, "a"}},
		{"cost above capacity", Config{KeyFunc: byKey, Cost: byCost}, []string{keyField, "a", costField, "6"}},
		{"cost 0", Config{KeyFunc: byKey, Cost: byCost}, []string{keyField, "a", costField, "0"}},
	} {
		want(t, tc.name, serve(t, d, tc.cfg, l).Do(t, tc.kv...), Invalid, "", "", "")
		logs := &records{}
		tc.cfg.Shadow, tc.cfg.Logger = true, slog.New(logs)
		want(t, tc.name+", shadow", serve(t, d, tc.cfg, l).Do(t, tc.kv...), OK, "", "", "")
		if got := logs.get(); len(got) != 1 || count(got, "WARN ") != 1 || count(got, ": shadow: call not checked")+
			count(got, ": shadow: request not checked") != 1 {
			t.Fatalf("%s, shadow: logs %q, want one warning", tc.name, got)
		}
	}
	if n := remaining(t, l, "a"); n != 5 {
		t.Fatalf("%d left, want 5: refused calls spend nothing", n)
	}
}

// Exempt calls go on unchecked, without fields, spending nothing, also
// once the others are denied.
func testExempt(t *testing.T, d suite) {
	l := d.limiter(t, "ex", 1, 10*time.Second)
	c := serve(t, d, Config{KeyFunc: byKey, Exempt: func(r Request) bool { return r.Get(exemptField) != "" }}, l)
	for range 3 {
		want(t, "exempt call", c.Do(t, keyField, "a", exemptField, "1"), OK, "", "", "")
	}
	if n := remaining(t, l, "a"); n != 1 {
		t.Fatalf("%d left after exempt calls, want 1", n)
	}
	want(t, "checked call", c.Do(t, keyField, "a"), OK, `"ex";q=1;w=10`, `"ex";r=0;t=10`, "")
	want(t, "checked call", c.Do(t, keyField, "a"), Denied, `"ex";q=1;w=10`, `"ex";r=0;t=10`, "10")
	want(t, "exempt call while denied", c.Do(t, keyField, "a", exemptField, "1"), OK, "", "", "")
}

// An exempt call never reaches the database, the key, limiters or cost
// funcs, nor the log, in shadow mode too.
func testExemptTouchesNothing(t *testing.T, d suite) {
	b := d.broken(t)
	var asked atomic.Int64
	logs := &records{}
	cfg := Config{
		KeyFunc: func(r Request) (string, error) { asked.Add(1); return byKey(r) },
		Cost:    func(Request) int64 { asked.Add(1); return 1 },
		Limiters: func(Request, string) ([]*pgratelimit.Limiter, error) {
			asked.Add(1)
			return []*pgratelimit.Limiter{b}, nil
		},
		Exempt: func(r Request) bool { return r.Get(exemptField) != "" },
		Logger: slog.New(logs),
	}
	for _, shadow := range []bool{false, true} {
		cfg.Shadow = shadow
		want(t, "exempt call", serve(t, d, cfg).Do(t, keyField, "a", exemptField, "1"), OK, "", "", "")
	}
	if n, got := asked.Load(), logs.get(); n != 0 || len(got) != 0 {
		t.Fatalf("%d asks and logs %q for exempt calls", n, got)
	}
	cfg.Shadow = false
	want(t, "a call not exempt", serve(t, d, cfg).Do(t, keyField, "a"), Unavailable, "", "", "")
	if n := asked.Load(); n != 3 {
		t.Fatalf("%d asks, want key, limiters and cost", n)
	}
}

// Cost takes that many tokens of each limiter.
func testCost(t *testing.T, d suite) {
	l := d.limiter(t, "c", 5, time.Hour)
	c := serve(t, d, Config{KeyFunc: byKey, Cost: byCost}, l)
	want(t, "cost 3", c.Do(t, keyField, "a", costField, "3"), OK, `"c";q=5;w=18000`, `"c";r=2;t=10800`, "")
	r := c.Do(t, keyField, "a", costField, "3")
	want(t, "cost 3 again", r, Denied, `"c";q=5;w=18000`, `"c";r=2;t=10800`, "3600")
	if r.HasRetryInfo && r.RetryDelay != time.Hour {
		t.Fatalf("RetryInfo's delay %s, want 1h", r.RetryDelay)
	}
	if n := remaining(t, l, "a"); n != 2 {
		t.Fatalf("%d left, want 2", n)
	}
}

// A database that fails (no tables, or nothing listening) fails calls
// closed (Unavailable), or lets them on without fields with FailOpen;
// logged either way.
func testFailClosedAndOpen(t *testing.T, d suite) {
	for name, l := range map[string]*pgratelimit.Limiter{"no tables": d.broken(t), "nothing listening": d.dead(t)} {
		logs := &records{}
		cfg := Config{KeyFunc: byKey, Logger: slog.New(logs)}
		want(t, name+", fail closed", serve(t, d, cfg, l).Do(t, keyField, "a"), Unavailable, "", "", "")
		cfg.FailOpen = true
		want(t, name+", fail open", serve(t, d, cfg, l).Do(t, keyField, "a"), OK, "", "", "")
		got := logs.get()
		if count(got, "ERROR ") != 2 || count(got, ": rate-limit check failed") != 2 ||
			count(got, "fail_open=false") != 1 || count(got, "fail_open=true") != 1 {
			t.Fatalf("%s: logs %q, want the two failures", name, got)
		}
	}
}

// Against a database that accepts connections and never answers, the
// check timeout ends the check: the call fails closed, or open with
// FailOpen.
func testCheckTimeout(t *testing.T, d suite) {
	l := d.newLimiter(t, silentPool(t), pgratelimit.Config{Prefix: "t", Capacity: 1, Refill: 1, Interval: time.Hour})
	cfg := Config{KeyFunc: byKey, CheckTimeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	want(t, "fail closed", serve(t, d, cfg, l).Do(t, keyField, "a"), Unavailable, "", "", "")
	cfg.FailOpen = true
	want(t, "fail open", serve(t, d, cfg, l).Do(t, keyField, "a"), OK, "", "", "")
}

// In shadow mode every call goes on without fields; the checks spend as
// enforced ones would, and each would-be denial is logged with the key,
// prefix and wait.
func testShadow(t *testing.T, d suite) {
	l := d.limiter(t, "sh", 1, 10*time.Second)
	logs := &records{}
	c := serve(t, d, Config{KeyFunc: byKey, Shadow: true, Logger: slog.New(logs)}, l)
	for range 3 {
		want(t, "shadow", c.Do(t, keyField, "a"), OK, "", "", "")
	}
	got := logs.get()
	if len(got) != 2 || count(got, "WARN ") != 2 || count(got, ": shadow: would deny") != 2 ||
		count(got, "key=a prefix=sh retry_after=10s") != 2 {
		t.Fatalf("logs %q, want two would-be denials", got)
	}
	want(t, "enforced", serve(t, d, Config{KeyFunc: byKey}, l).Do(t, keyField, "a"), Denied, `"sh";q=1;w=10`, `"sh";r=0;t=10`, "10")
}

// Shadow mode denies nothing, even when the check cannot be made.
func testShadowFailures(t *testing.T, d suite) {
	logs := &records{}
	c := serve(t, d, Config{KeyFunc: byKey, Shadow: true, Logger: slog.New(logs)}, d.broken(t))
	want(t, "no key", c.Do(t), OK, "", "", "")
	want(t, "no tables", c.Do(t, keyField, "a"), OK, "", "", "")
	if got := logs.get(); count(got, " not checked") != 1 || count(got, ": rate-limit check failed") != 1 {
		t.Fatalf("logs %q, want the refusal and the failure", got)
	}
}

// silentPool is a pool whose database accepts connections and never
// answers: a server that hangs, or a firewall that swallows packets after
// the handshake.
func silentPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pool, err := pgxpool.New(context.Background(), "postgres://user@"+ln.Addr().String()+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the listener closes: cancels the connects
	return pool
}

// newSemaphore is a semaphore on pool, failing the test on an error.
func newSemaphore(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.SemaphoreConfig) *pgratelimit.Semaphore {
	t.Helper()
	s, err := pgratelimit.NewSemaphore(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// leases waits until key's leases of s number n, and returns them.
func leases(t *testing.T, s *pgratelimit.Semaphore, key string, n int) []pgratelimit.Lease {
	t.Helper()
	return until(t, s, key, func(ls []pgratelimit.Lease) bool { return len(ls) == n })
}

// until waits until key's leases of s are as ok says (ten seconds at
// most), and returns them.
func until(t *testing.T, s *pgratelimit.Semaphore, key string, ok func([]pgratelimit.Lease) bool) []pgratelimit.Lease {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ls, err := s.Leases(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if ok(ls) {
			return ls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: leases %+v, not as the test waits for", key, ls)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

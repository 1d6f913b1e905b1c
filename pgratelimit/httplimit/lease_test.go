package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// newSemaphore is a semaphore on a fresh schema, failing the test on an
// error.
func newSemaphore(t *testing.T, cfg pgratelimit.SemaphoreConfig) *pgratelimit.Semaphore {
	t.Helper()
	s, err := pgratelimit.NewSemaphore(testdb.Pool(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// held waits until key's leases number n, and returns them.
func held(t *testing.T, s *pgratelimit.Semaphore, key string, n int) []pgratelimit.Lease {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ls, err := s.Leases(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == n {
			return ls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d leases, want %d", key, len(ls), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A request holds a lease of its key while its handler runs, extended past
// the TTL while it runs, released when it returns or panics; a request
// that finds no free slot gets 429 with the semaphore's fields; exempt
// requests take no lease.
func TestSemaphore(t *testing.T) {
	t.Parallel()
	s := newSemaphore(t, pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 1, TTL: 300 * time.Millisecond})
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	h := Middleware(nil, Options{Semaphore: s, Exempt: ExemptPaths("/healthz")})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			started <- struct{}{}
			<-gate
		case "/panic":
			panic("boom")
		}
	}))
	peer := "203.0.113.9:1234"
	do := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = peer
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	slow := make(chan *httptest.ResponseRecorder, 1)
	go func() { slow <- do("/slow") }()
	<-started
	first := held(t, s, "ip:203.0.113.9", 1)[0]
	time.Sleep(700 * time.Millisecond) // over twice the TTL
	if now := held(t, s, "ip:203.0.113.9", 1)[0]; now.ID != first.ID || !now.ExpiresAt.After(first.ExpiresAt) {
		t.Fatalf("the lease was not extended: %+v, then %+v", first, now)
	}

	w := do("/")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d", w.Code)
	}
	for k, v := range map[string]string{"RateLimit-Policy": `"conc";q=1`, "RateLimit": `"conc";r=0`, "Retry-After": "1"} {
		if got := w.Header().Get(k); got != v {
			t.Fatalf("%s: %q, want %q", k, got, v)
		}
	}
	if w := do("/healthz"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != "" {
		t.Fatalf("exempt: %d %v", w.Code, w.Header())
	}

	close(gate)
	if w := <-slow; w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"conc";r=0` {
		t.Fatalf("slow request: %d %v", w.Code, w.Header())
	}
	held(t, s, "ip:203.0.113.9", 0)

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the handler's panic did not come through")
			}
		}()
		do("/panic")
	}()
	held(t, s, "ip:203.0.113.9", 0)
	if w := do("/"); w.Code != http.StatusOK {
		t.Fatalf("after the panic: %d", w.Code)
	}
}

// A lease and a rate limit on one request: all or nothing, both policies
// in RateLimit-Policy, the weight from Options.Weight.
func TestSemaphoreWithLimiter(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	l := newLimiter(t, pool, pgratelimit.Config{Prefix: "api", Capacity: 10, Refill: 10, Interval: 10 * time.Second})
	s, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 4, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	h := Middleware(l, Options{Semaphore: s, Weight: func(*http.Request) int64 { return 3 }})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	w := get(h, "203.0.113.9:1")
	if w.Code != http.StatusOK {
		t.Fatalf("%d", w.Code)
	}
	if got, want := w.Header().Get("RateLimit-Policy"), `"api";q=10;w=10, "conc";q=4`; got != want {
		t.Fatalf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := w.Header().Get("RateLimit"), `"conc";r=1`; got != want {
		t.Fatalf("RateLimit %q, want %q", got, want)
	}
	held(t, s, "ip:203.0.113.9", 0)
}

package httplimit

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// at serves a GET of path from 192.0.2.1.
func at(h http.Handler, path string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// requireNoFields fails unless w has none of the rate-limit headers.
func requireNoFields(t *testing.T, what string, w *httptest.ResponseRecorder) {
	t.Helper()
	for _, k := range []string{"RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if v := w.Header().Get(k); v != "" {
			t.Fatalf("%s: %s: %s on an exempt request", what, k, v)
		}
	}
}

// Exempt requests go through unchecked, without rate-limit headers, and
// spend nothing: the bucket is whole for the first checked request, and the
// exempt path still answers once the others are denied. Only exact paths
// are exempt.
func TestExempt(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) // on the buckets' grid: the fields are exact
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "ex", Capacity: 1, Refill: 1, Interval: time.Hour,
		Clock: func() time.Time { return t0 }})
	h := Middleware(l, Options{Exempt: ExemptPaths("/healthz", "/readyz"), LegacyHeaders: true})(ok)
	for i := range 3 {
		w := at(h, "/healthz")
		if w.Code != http.StatusOK || w.Body.String() != "ok" {
			t.Fatalf("exempt request %d: %d %q", i, w.Code, w.Body)
		}
		requireNoFields(t, "exempt", w)
	}
	if r, err := l.Peek(context.Background(), "ip:192.0.2.1"); err != nil || r.Remaining != 1 {
		t.Fatalf("after exempt requests: %+v %v, want the bucket whole", r, err)
	}
	if w := at(h, "/"); w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"ex";r=0;t=3600` {
		t.Fatalf("first checked request: %d %v", w.Code, w.Header())
	}
	for _, path := range []string{"/", "/healthz/", "/healthz/../x", "/readyz/x"} {
		if w := at(h, path); w.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: %d, want it checked and denied", path, w.Code)
		}
	}
	w := at(h, "/readyz")
	if w.Code != http.StatusOK {
		t.Fatalf("exempt request while denied: %d", w.Code)
	}
	requireNoFields(t, "exempt while denied", w)
}

// An exempt request never reaches the limiter, its key, cost or limiters
// functions: it goes through with a database that fails closed, and in
// shadow mode it is not logged.
func TestExemptTouchesNothing(t *testing.T) {
	t.Parallel()
	broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
	var asked atomic.Int64
	exempt := func(r *http.Request) bool { return r.Header.Get("X-Internal") == "yes" }
	logs := &records{}
	opts := Options{
		Exempt:  exempt,
		KeyFunc: func(*http.Request) (string, error) { asked.Add(1); return "k", nil },
		Cost:    func(*http.Request) int64 { asked.Add(1); return 1 },
		Limiters: func(*http.Request, string) ([]*pgratelimit.Limiter, error) {
			asked.Add(1)
			return []*pgratelimit.Limiter{broken}, nil
		},
		Logger: slog.New(logs),
	}
	internal := func(h http.Handler) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Internal", "yes")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, shadow := range []bool{false, true} {
		opts.Shadow = shadow
		h := Middleware(broken, opts)(ok)
		w := internal(h)
		if w.Code != http.StatusOK {
			t.Fatalf("shadow %v: exempt request with a failing database: %d", shadow, w.Code)
		}
		requireNoFields(t, "exempt", w)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("key, cost or limiters asked %d times for exempt requests", n)
	}
	if got := logs.lines(); len(got) != 0 {
		t.Fatalf("logs %q for exempt requests", got)
	}
	opts.Shadow = false
	if w := at(Middleware(broken, opts)(ok), "/"); w.Code != http.StatusServiceUnavailable || asked.Load() != 3 {
		t.Fatalf("a request not exempt: %d, %d asks, want 503 after key, limiters and cost", w.Code, asked.Load())
	}
}

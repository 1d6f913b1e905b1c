package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The cases every adapter shares run in conformance_test.go; these are
// HTTP's own.

func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

// get serves a GET of path from peer with the header pairs kv.
func get(h http.Handler, path, peer string, kv ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Set(kv[i], kv[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func mustMiddleware(t *testing.T, cfg Config, limiters ...*pgratelimit.Limiter) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := Middleware(cfg, limiters...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

func TestKeyFuncs(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "[2001:db8:1:2:3:4:5:6]:443"
	k, err := KeyByIP(IPKeyConfig{IPv6Prefix: 64})(r)
	if err != nil || k != "ip:2001:db8:1:2::/64" {
		t.Fatalf("IPv6 /64: %q %v", k, err)
	}
	if a, err := ClientIP(r, nil); err != nil || a.String() != "2001:db8:1:2:3:4:5:6" {
		t.Fatalf("ClientIP: %s %v", a, err)
	}
	r.RemoteAddr = "not an address"
	if _, err := KeyByIP(IPKeyConfig{})(r); !errors.Is(err, ErrNoKey) {
		t.Fatalf("bad remote address: %v, want ErrNoKey", err)
	}
	if _, err := ClientIP(r, nil); !errors.Is(err, ErrNoKey) {
		t.Fatalf("ClientIP of a bad remote address: %v, want ErrNoKey", err)
	}
	if _, err := KeyByHeader("X-API-Key")(r); !errors.Is(err, ErrNoKey) {
		t.Fatalf("missing header: %v, want ErrNoKey", err)
	}
	r.Header.Set("X-API-Key", "secret")
	k, err = KeyByHeader("X-API-Key")(r)
	// sha256("secret")
	if err != nil || k != "hdr:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b" {
		t.Fatalf("header key %q %v", k, err)
	}
}

// Only exact paths are exempt: no other route is reached through one.
func TestExemptPaths(t *testing.T) {
	exempt := ExemptPaths("/healthz", "/readyz")
	for path, want := range map[string]bool{"/healthz": true, "/readyz": true, "/": false, "/healthz/": false, "/healthz/../x": false, "/readyz/x": false} {
		if got := exempt(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

// LegacyHeaders adds the X-RateLimit fields of the limit RateLimit
// reports; DeniedHandler and ErrorHandler answer denials and refusals.
func TestHandlersAndLegacyHeaders(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	l, err := pgratelimit.New(testdb.Pool(t), pgratelimit.Config{Prefix: "lg", Capacity: 2, Refill: 1, Interval: time.Minute, Clock: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	var refused error
	h := mustMiddleware(t, Config{
		KeyFunc:       KeyByHeader("X-API-Key"),
		LegacyHeaders: true,
		DeniedHandler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			refused = err
			w.WriteHeader(http.StatusUnauthorized)
		},
	}, l)(ok)
	w := get(h, "/", "192.0.2.1:1", "X-API-Key", "k")
	if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") != "2" || w.Header().Get("X-RateLimit-Remaining") != "1" || w.Header().Get("X-RateLimit-Reset") != "60" {
		t.Fatalf("allowed: %d %v", w.Code, w.Header())
	}
	get(h, "/", "192.0.2.1:1", "X-API-Key", "k")
	if w := get(h, "/", "192.0.2.1:1", "X-API-Key", "k"); w.Code != http.StatusTeapot || w.Header().Get("Retry-After") != "60" || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("denied: %d %v", w.Code, w.Header())
	}
	if w := get(h, "/", "192.0.2.1:1"); w.Code != http.StatusUnauthorized || !errors.Is(refused, ErrNoKey) {
		t.Fatalf("no key: %d %v", w.Code, refused)
	}
}

// A handler's panic releases the request's lease, and comes through.
func TestPanicReleasesLease(t *testing.T) {
	t.Parallel()
	s, err := pgratelimit.NewSemaphore(testdb.Pool(t), pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	h := mustMiddleware(t, Config{Semaphore: s})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the handler's panic did not come through")
			}
		}()
		get(h, "/", "203.0.113.9:1")
	}()
	if ls, err := s.Leases(context.Background(), "ip:203.0.113.9"); err != nil || len(ls) != 0 {
		t.Fatalf("after the panic: leases %+v %v", ls, err)
	}
}

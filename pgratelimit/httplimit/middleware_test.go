package httplimit

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

// modes runs f with coalescing on and off.
func modes(t *testing.T, f func(t *testing.T, disableCoalescing bool)) {
	for _, off := range []bool{false, true} {
		name := "coalescing"
		if off {
			name = "per-check"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, off)
		})
	}
}

func newLimiter(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func get(h http.Handler, peer string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// records is a slog handler that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// lines renders the records as "LEVEL message k=v ...".
func (h *records) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		s := r.Level.String() + " " + r.Message
		r.Attrs(func(a slog.Attr) bool {
			s += " " + a.String()
			return true
		})
		out = append(out, s)
	}
	return out
}

// In shadow mode every request goes through without rate-limit headers;
// the checks still spend (so enforcing afterwards sees the same bucket), and
// each would-be denial is logged with the key, prefix and retry delay.
func TestShadow(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		pool := testdb.Pool(t)
		l := newLimiter(t, pool, pgratelimit.Config{Prefix: "sh", Capacity: 2, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		logs := &records{}
		h := Middleware(l, Options{Shadow: true, Logger: slog.New(logs)})(ok)
		for i := range 4 {
			w := get(h, "192.0.2.1:1")
			if w.Code != http.StatusOK || w.Body.String() != "ok" {
				t.Fatalf("request %d: %d %q", i, w.Code, w.Body)
			}
			for _, k := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
				if v := w.Header().Get(k); v != "" {
					t.Fatalf("request %d: %s: %s in shadow mode", i, k, v)
				}
			}
		}
		got := logs.lines()
		want := "WARN httplimit: shadow: would deny key=ip:192.0.2.1 prefix=sh retry_after="
		if len(got) != 2 || !strings.HasPrefix(got[0], want) || !strings.HasPrefix(got[1], want) {
			t.Fatalf("logs: %q, want two of %q", got, want)
		}
		// Enforced, the same bucket is empty: the two allowed shadow checks
		// took their tokens, the two denied ones took nothing.
		w := get(Middleware(l, Options{})(ok), "192.0.2.1:1")
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("enforced after shadow: %d", w.Code)
		}
		if r, err := l.Peek(context.Background(), "ip:192.0.2.1"); err != nil || r.Remaining != 0 {
			t.Fatalf("peek: %+v %v", r, err)
		}
	})
}

// Shadow mode denies nothing even when the check cannot be made: a request
// without a key, or a database without the tables, goes through (logged).
func TestShadowFailures(t *testing.T) {
	t.Parallel()
	broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
	logs := &records{}
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no key", Options{KeyFunc: KeyByHeader("X-API-Key")}, "WARN httplimit: shadow: request not checked error="},
		{"no tables", Options{}, "ERROR httplimit: rate-limit check failed error="},
	} {
		tc.opts.Shadow, tc.opts.Logger = true, slog.New(logs)
		if w := get(Middleware(broken, tc.opts)(ok), "192.0.2.1:1"); w.Code != http.StatusOK {
			t.Fatalf("%s: %d in shadow mode", tc.name, w.Code)
		}
		tc.opts.Shadow = false
		if w := get(Middleware(broken, tc.opts)(ok), "192.0.2.1:1"); w.Code == http.StatusOK {
			t.Fatalf("%s: enforced, %d", tc.name, w.Code)
		}
		got := logs.lines()
		if len(got) == 0 || !strings.HasPrefix(got[0], tc.want) {
			t.Fatalf("%s: logs %q, want %q", tc.name, got, tc.want)
		}
		logs.recs = nil
	}
}

// silentPool is a pool whose database accepts connections and never
// answers: a server that hangs, or a firewall that swallows packets after the
// handshake.
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
	cfg, err := pgxpool.ParseConfig("postgres://user@" + ln.Addr().String() + "/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the listener closes: cancels the connects
	return pool
}

// Against a database that accepts connections and never answers, a request
// is answered within Options.CheckTimeout: 503 failing closed, the handler's
// answer failing open; and within DefaultCheckTimeout with default options.
func TestCheckTimeout(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, silentPool(t), pgratelimit.Config{Prefix: "t", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		quiet := slog.New(slog.DiscardHandler)
		for _, tc := range []struct {
			name  string
			opts  Options
			bound time.Duration
			code  int
		}{
			{"closed", Options{CheckTimeout: 200 * time.Millisecond, Logger: quiet}, 200 * time.Millisecond, http.StatusServiceUnavailable},
			{"open", Options{CheckTimeout: 200 * time.Millisecond, FailOpen: true, Logger: quiet}, 200 * time.Millisecond, http.StatusOK},
			{"default", Options{Logger: quiet}, DefaultCheckTimeout, http.StatusServiceUnavailable},
		} {
			h := Middleware(l, tc.opts)(ok)
			start := time.Now()
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- get(h, "192.0.2.1:1") }()
			select {
			case w := <-done:
				took := time.Since(start)
				if w.Code != tc.code {
					t.Fatalf("%s: %d, want %d", tc.name, w.Code, tc.code)
				}
				// Not before the bound; then at once, or within a few seconds on a
				// busy machine under -race: long before the failsafe.
				if took < tc.bound || took > tc.bound+5*time.Second {
					t.Fatalf("%s: answered in %s, bound %s", tc.name, took, tc.bound)
				}
			case <-time.After(tc.bound + 30*time.Second):
				t.Fatalf("%s: no answer %s after the bound", tc.name, 30*time.Second)
			}
		}
	})
}

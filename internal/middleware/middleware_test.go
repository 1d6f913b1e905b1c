package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The checks that reach a database are tested through the adapters
// (httplimit, grpclimit, connectlimit), against a real one; these are the
// decisions made without one.

// records is a slog handler that keeps what it is given, as "LEVEL message
// k=v ...".
type records struct {
	mu    sync.Mutex
	lines []string
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	s := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		s += " " + a.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, s)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// unreachable is a limiter whose database refuses connections: every check
// that gets as far as the database fails at once.
func unreachable(t *testing.T) *pgratelimit.Limiter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	pool, err := pgxpool.New(context.Background(), "postgres://user@"+addr+"/db?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "u", Capacity: 5, Refill: 1, Interval: time.Second, DisableCoalescing: true})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// config is a Config of requests named by a string, checked against l with
// the key "k", logging to logs.
func config(l *pgratelimit.Limiter, logs *records) Config[string] {
	return Config[string]{
		Name:  "test",
		Noun:  "call",
		Attrs: func(name string) []any { return []any{"name", name} },
		Key:   func(context.Context, string) (string, error) { return "k", nil },
		Limiters: func(context.Context, string, string) ([]*pgratelimit.Limiter, error) {
			return []*pgratelimit.Limiter{l}, nil
		},
		Logger: slog.New(logs),
	}
}

func check(t *testing.T, c *Core[string], ctx context.Context, name string) Decision {
	t.Helper()
	d, release := c.Check(ctx, name)
	if release == nil {
		t.Fatalf("%s: release is nil", name)
	}
	release()
	return d
}

// An exempt request is decided before anything else is asked of it: no key,
// no limiters, no cost, no check, no log, even in shadow mode.
func TestExempt(t *testing.T) {
	t.Parallel()
	logs := &records{}
	cfg := config(unreachable(t), logs)
	touched := func(what string) { t.Errorf("%s asked for an exempt request", what) }
	cfg.Key = func(context.Context, string) (string, error) { touched("key"); return "k", nil }
	cfg.Limiters = func(context.Context, string, string) ([]*pgratelimit.Limiter, error) {
		touched("limiters")
		return nil, errors.New("no")
	}
	cfg.Cost = func(context.Context, string) int64 { touched("cost"); return 1 }
	cfg.Exempt = func(_ context.Context, name string) bool { return name == "health" }
	for _, shadow := range []bool{false, true} {
		cfg.Shadow = shadow
		if d := check(t, New(cfg), context.Background(), "health"); d.Verdict != Exempt || d.Err != nil || d.Fields != (Fields{}) {
			t.Fatalf("shadow %v: %+v, want an exempt decision and nothing else", shadow, d)
		}
	}
	if got := logs.get(); len(got) != 0 {
		t.Fatalf("logs %q for exempt requests", got)
	}
}

// A request without a key or limiters, or with a cost pgratelimit refuses,
// is Invalid; in shadow mode it passes, logged.
func TestInvalid(t *testing.T) {
	t.Parallel()
	l := unreachable(t)
	noKey := errors.New("no key here")
	for _, tc := range []struct {
		name string
		set  func(*Config[string])
		is   error
	}{
		{"key", func(c *Config[string]) {
			c.Key = func(context.Context, string) (string, error) { return "", noKey }
		}, noKey},
		{"limiters", func(c *Config[string]) {
			c.Limiters = func(context.Context, string, string) ([]*pgratelimit.Limiter, error) { return nil, noKey }
		}, noKey},
		{"cost", func(c *Config[string]) { c.Cost = func(context.Context, string) int64 { return 0 } }, pgratelimit.ErrInvalidCost},
		{"capacity", func(c *Config[string]) { c.Cost = func(context.Context, string) int64 { return 6 } }, pgratelimit.ErrCostExceedsCapacity},
		{"empty key", func(c *Config[string]) {
			c.Key = func(context.Context, string) (string, error) { return "", nil }
		}, pgratelimit.ErrInvalidKey},
	} {
		logs := &records{}
		cfg := config(l, logs)
		tc.set(&cfg)
		d := check(t, New(cfg), context.Background(), tc.name)
		if d.Verdict != Invalid || !errors.Is(d.Err, tc.is) {
			t.Fatalf("%s: %v %v, want invalid %v", tc.name, d.Verdict, d.Err, tc.is)
		}
		cfg.Shadow = true
		d = check(t, New(cfg), context.Background(), tc.name)
		if d.Verdict != Pass || !errors.Is(d.Err, tc.is) {
			t.Fatalf("%s, shadow: %v %v, want pass", tc.name, d.Verdict, d.Err)
		}
		want := "WARN test: shadow: call not checked name=" + tc.name + " error="
		if got := logs.get(); len(got) != 1 || !strings.HasPrefix(got[0], want) {
			t.Fatalf("%s: logs %q, want %q", tc.name, got, want)
		}
	}
}

// A check that fails is Unavailable, or Pass failing open or in shadow
// mode, logged either way; one whose request's context ended first is Ended
// (not logged) when the adapter asks, a failure like any other otherwise.
func TestFailures(t *testing.T) {
	t.Parallel()
	l := unreachable(t)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		set  func(*Config[string])
		want Verdict
		log  string
	}{
		{"closed", context.Background(), func(*Config[string]) {}, Unavailable, "ERROR test: rate-limit check failed name=closed error="},
		{"open", context.Background(), func(c *Config[string]) { c.FailOpen = true }, Pass, "ERROR test: rate-limit check failed name=open error="},
		{"shadow", context.Background(), func(c *Config[string]) { c.Shadow = true }, Pass, "ERROR test: rate-limit check failed name=shadow error="},
		{"ended", ended, func(c *Config[string]) { c.ReportEnded = true }, Ended, ""},
		{"ended, not reported", ended, func(*Config[string]) {}, Unavailable, "ERROR test: rate-limit check failed name=ended, not reported error="},
	} {
		logs := &records{}
		cfg := config(l, logs)
		tc.set(&cfg)
		d := check(t, New(cfg), tc.ctx, tc.name)
		if d.Verdict != tc.want || d.Err == nil {
			t.Fatalf("%s: %v %v, want %v with the error", tc.name, d.Verdict, d.Err, tc.want)
		}
		if tc.want == Ended && !errors.Is(d.Err, context.Canceled) {
			t.Fatalf("%s: %v, want the context's error", tc.name, d.Err)
		}
		got := logs.get()
		if tc.log == "" && len(got) != 0 || tc.log != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.log)) {
			t.Fatalf("%s: logs %q, want %q", tc.name, got, tc.log)
		}
		if suffix := " fail_open=" + strconv.FormatBool(tc.want == Pass); tc.log != "" && !strings.HasSuffix(got[0], suffix) {
			t.Fatalf("%s: log %q, want it to end with %q", tc.name, got[0], suffix)
		}
	}
}

func TestNewPanicsWithoutRequiredFields(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New with an empty Config did not panic")
		}
	}()
	New(Config[string]{})
}

func TestMatchMethods(t *testing.T) {
	match := MatchMethods("grpc.health.v1.Health", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
		"pkg.Svc/Ping", "other.Svc/", "")
	for method, want := range map[string]bool{
		"/grpc.health.v1.Health/Check":                                   true,
		"/grpc.health.v1.Health/Watch":                                   true,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      true,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": false,
		"/pkg.Svc/Ping":                       true,
		"/pkg.Svc/Pong":                       false,
		"/other.Svc/Anything":                 true,
		"/grpc.health.v1.HealthX/Check":       false,
		"/grpc.health.v1/Health/Check":        false,
		"grpc.health.v1.Health":               false,
		"":                                    false,
		"/":                                   false,
		"/grpc.health.v1.Health.Check/Method": false,
	} {
		if got := match(method); got != want {
			t.Errorf("%q: %v, want %v", method, got, want)
		}
	}
	if MatchMethods()("/a.B/C") {
		t.Error("no names matched a method")
	}
}

func TestFields(t *testing.T) {
	allowed := Fields{Policy: `"a";q=1;w=1`, RateLimit: `"a";r=0;t=1`}
	if got, want := allowed.Pairs(), []string{"RateLimit-Policy", `"a";q=1;w=1`, "RateLimit", `"a";r=0;t=1`}; !slices.Equal(got, want) {
		t.Fatalf("pairs %q, want %q", got, want)
	}
	denied := allowed
	denied.RetryAfter = "3"
	h := http.Header{"Retry-After": {"old"}}
	denied.Set(h)
	if len(h) != 3 || h.Get("RateLimit-Policy") != denied.Policy || h.Get("RateLimit") != denied.RateLimit || h.Get("Retry-After") != "3" {
		t.Fatalf("header %v", h)
	}
	if got := Verdict(42).String(); got != "Verdict(42)" {
		t.Fatalf("%q", got)
	}
	if got := Deny.String(); got != "deny" {
		t.Fatalf("%q", got)
	}
	if got := (Decision{}).Verdict.String(); got != "Verdict(0)" {
		t.Fatalf("the zero verdict: %q", got)
	}
}

func TestKeys(t *testing.T) {
	// sha256("secret"), as the adapters' tests expect it.
	if got := SecretKey("secret"); got != "hdr:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b" {
		t.Fatal(got)
	}
	if got := MethodKey("/a.B/C"); got != "method:/a.B/C" {
		t.Fatal(got)
	}
}

// w is counted from the check's clock, not the application's: a calendar
// quota's w and t agree whatever the skew between the two (issue #31).
func TestWindowByTheChecksClock(t *testing.T) {
	cfg := pgratelimit.Config{Prefix: "q", Capacity: 1000, Refill: 1000, Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}}
	p := account.Policy{Capacity: 1000, Refill: 1000, Schedule: account.Calendar(account.Month, nil, time.Time{})}
	checked := time.Date(2026, 1, 10, 12, 0, 0, 300_000_000, time.UTC)
	_, c, err := account.Apply(p, account.State{}, checked, account.Op{Kind: account.OpCharge, Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := pgratelimit.Result{Allowed: true, Limit: c.Limit, Remaining: c.Remaining, ResetAfter: c.ResetAfter}
	for _, skew := range []time.Duration{0, 7 * time.Minute, -3 * time.Hour, 11 * time.Hour} {
		if w, want := Window(cfg, r, checked.Add(skew)), CeilSeconds(r.ResetAfter); w != want {
			t.Errorf("skew %v: w %d, t %d", skew, w, want)
		}
	}
	// With Refill below Capacity: the boundary that fills an empty bucket.
	cfg.Refill, p.Refill = 400, 400
	_, c, _ = account.Apply(p, account.State{}, checked, account.Op{Kind: account.OpCharge, Amount: 500})
	r = pgratelimit.Result{Allowed: true, Limit: c.Limit, Remaining: c.Remaining, ResetAfter: c.ResetAfter}
	want := CeilSeconds(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(checked)) // three refills
	if w := Window(cfg, r, checked.Add(5*time.Minute)); w != want {
		t.Errorf("rollover: w %d, want %d", w, want)
	}
}

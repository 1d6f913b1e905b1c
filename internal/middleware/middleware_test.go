package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
		if d := check(t, mustNew(t, cfg), context.Background(), "health"); d.Verdict != Exempt || d.Err != nil || d.Fields != (Fields{}) {
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
		d := check(t, mustNew(t, cfg), context.Background(), tc.name)
		if d.Verdict != Invalid || !errors.Is(d.Err, tc.is) {
			t.Fatalf("%s: %v %v, want invalid %v", tc.name, d.Verdict, d.Err, tc.is)
		}
		cfg.Shadow = true
		d = check(t, mustNew(t, cfg), context.Background(), tc.name)
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
		d := check(t, mustNew(t, cfg), tc.ctx, tc.name)
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

// mustNew is New(cfg, nil), failing the test on an error.
func mustNew(t *testing.T, cfg Config[string]) *Core[string] {
	t.Helper()
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A Config that cannot check anything, or is half made, is refused by New
// with ErrInvalidConfig naming what is wrong.
func TestNewRefuses(t *testing.T) {
	l := unreachable(t)
	key := func(context.Context, string) (string, error) { return "k", nil }
	base := Config[string]{Name: "test", Noun: "call", Key: key}
	weight := base
	weight.Weight = func(context.Context, string) int64 { return 2 }
	for _, tc := range []struct {
		name     string
		cfg      Config[string]
		limiters []*pgratelimit.Limiter
		want     string
	}{
		{"empty", Config[string]{}, []*pgratelimit.Limiter{l}, "needs a Name, a Noun and a Key"},
		{"nothing to check", base, nil, "nothing to check"},
		{"nil limiter", base, []*pgratelimit.Limiter{l, nil}, "limiter 1 is nil"},
		{"weight", weight, []*pgratelimit.Limiter{l}, "Config.Weight needs Config.Semaphore"},
	} {
		_, err := New(tc.cfg, tc.limiters)
		if !errors.Is(err, pgratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidConfig saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(base, []*pgratelimit.Limiter{l}); err != nil {
		t.Fatalf("a limiter given: %v", err)
	}
}

func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"no proxy", "203.0.113.9:5555", nil, "203.0.113.9"},
		{"spoofed header from an untrusted peer is ignored", "203.0.113.9:5555", []string{"1.1.1.1"}, "203.0.113.9"},
		{"trusted peer, one hop", "10.0.0.2:80", []string{"198.51.100.7"}, "198.51.100.7"},
		{"client prepends a spoofed hop: still the rightmost untrusted", "10.0.0.2:80", []string{"1.1.1.1, 198.51.100.7"}, "198.51.100.7"},
		{"trusted hops are skipped", "10.0.0.2:80", []string{"198.51.100.7, 10.1.1.1", "10.2.2.2"}, "198.51.100.7"},
		{"all hops trusted: the leftmost", "10.0.0.2:80", []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"garbage stops at the last trusted hop", "10.0.0.2:80", []string{"198.51.100.7, nonsense, 10.1.1.1"}, "10.1.1.1"},
		{"trusted peer without header", "10.0.0.2:80", nil, "10.0.0.2"},
		{"IPv6 peer", "[2001:db8::1]:443", nil, "2001:db8::1"},
		{"IPv4-mapped IPv6 is unmapped", "[::ffff:203.0.113.9]:1", nil, "203.0.113.9"},
		{"IPv6 via trusted IPv6 proxy, with port in header", "[fd00::1]:80", []string{"[2001:db8::5]:1234"}, "2001:db8::5"},
	} {
		got, err := ClientAddr(tc.peer, tc.xff, trusted)
		if err != nil || got.String() != tc.want {
			t.Errorf("%s: %s %v, want %s", tc.name, got, err, tc.want)
		}
	}
	if _, err := ClientAddr("not an address", nil, trusted); err == nil {
		t.Error("an unparsable peer gave an address")
	}
}

func TestIPKey(t *testing.T) {
	peer := "[2001:db8:1:2:3:4:5:6]:443"
	if k, err := (IPKeyConfig{IPv6Prefix: 64}).Key(peer, nil); err != nil || k != "ip:2001:db8:1:2::/64" {
		t.Fatalf("IPv6 /64: %q %v", k, err)
	}
	if k, err := (IPKeyConfig{}).Key(peer, nil); err != nil || k != "ip:2001:db8:1:2:3:4:5:6" {
		t.Fatalf("IPv6: %q %v", k, err)
	}
	if k, err := (IPKeyConfig{IPv6Prefix: 64}).Key("192.0.2.1:1", nil); err != nil || k != "ip:192.0.2.1" {
		t.Fatalf("IPv4 with an IPv6 prefix: %q %v", k, err)
	}
	if _, err := (IPKeyConfig{}).Key("", nil); err == nil {
		t.Fatal("no peer gave a key")
	}
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

func TestFieldHelpers(t *testing.T) {
	if got := SFString("a\"b\\c\r\nd\xff"); got != `"a\"b\\c??d?"` {
		t.Fatalf("SFString: %s", got)
	}
	for d, want := range map[time.Duration]int64{0: 0, time.Nanosecond: 1, time.Second: 1, 1500 * time.Millisecond: 2} {
		if got := CeilSeconds(d); got != want {
			t.Fatalf("CeilSeconds(%s) = %d", d, got)
		}
	}
	if got := sfInt(MaxSFInteger + 1); got != MaxSFInteger {
		t.Fatalf("sfInt: %d", got)
	}
}

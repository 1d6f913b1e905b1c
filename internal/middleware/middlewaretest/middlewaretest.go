// Package middlewaretest is the conformance suite of the rate-limiting
// middleware of this repository: httplimit, grpclimit and connectlimit each
// run Run with a Driver of their own (how to build the adapter from a
// Config, make a call with header fields, and read the answer), and the
// same cases run against each, on a real database: allowed and denied
// calls with their fields and retry information, key and limiter errors,
// exemptions, costs, failing open or closed on a dead database, the check
// timeout, shadow mode, a lease held for a call, limiters picked per call,
// several limiters charged at once, and the Configs refused when building;
// each with limiters that coalesce their checks and with limiters that do
// not.
// What only one protocol has (streams, HTTP's legacy headers, go-grpc-
// middleware's chain) stays in that adapter's tests.
package middlewaretest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Request is what a Config's funcs read of a call: its header fields
// (HTTP or Connect headers, gRPC metadata), by lower-case name.
type Request interface {
	Get(name string) string
}

// Config is an adapter's Config, as the suite sets it: a Driver copies
// each field to the field of the same name of its adapter's Config (a nil
// func stays nil, so that the adapter's default applies).
type Config struct {
	KeyFunc      func(Request) (string, error)
	Limiters     func(r Request, key string) ([]*pgratelimit.Limiter, error)
	Cost         func(Request) int64
	Exempt       func(Request) bool
	Semaphore    *pgratelimit.Semaphore
	Weight       func(Request) int64
	FailOpen     bool
	Shadow       bool
	CheckTimeout time.Duration
	Logger       *slog.Logger
}

// Status is what became of a call, as the suite tells them apart; a Driver
// maps its protocol's statuses onto them as its package doc says.
type Status int

const (
	// OK: the call reached its handler (HTTP 200, codes.OK).
	OK Status = iota + 1
	// Denied: rate limited (HTTP 429, ResourceExhausted).
	Denied
	// Invalid: the call's own fault (HTTP 400, InvalidArgument).
	Invalid
	// Unavailable: the check failed, failing closed (HTTP 503,
	// Unavailable).
	Unavailable
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Denied:
		return "denied"
	case Invalid:
		return "invalid"
	case Unavailable:
		return "unavailable"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Response is the answer to a call, as a Driver reads it.
type Response struct {
	// Status is the call's outcome; Raw the protocol's own status, for
	// messages.
	Status Status
	Raw    string
	// Policy, RateLimit and RetryAfter are the values of the
	// RateLimit-Policy, RateLimit and Retry-After fields (headers, header
	// metadata or an error's metadata), empty when absent.
	Policy, RateLimit, RetryAfter string
	// RetryDelay is the exact wait that a denial's RetryInfo detail
	// carries, when HasRetryInfo.
	RetryDelay   time.Duration
	HasRetryInfo bool
}

// Driver builds one adapter for the suite.
type Driver interface {
	// Serve returns a client of a server whose calls go through the
	// adapter built from cfg and limiters, then to a handler that calls
	// handle with the call; or the error of the adapter's constructor.
	Serve(t *testing.T, cfg Config, handle func(Request), limiters ...*pgratelimit.Limiter) (Client, error)
	// PeerKey is the key the adapter's default KeyFunc gives the client's
	// calls: "ip:127.0.0.1" for a loopback client.
	PeerKey() string
}

// Client makes calls to a server that Driver.Serve started.
type Client interface {
	// Do makes a call with the header fields kv (name, value pairs, names
	// in lower case) and returns its answer; it fails the test when the
	// call cannot be made or its answer read.
	Do(t *testing.T, kv ...string) Response
}

// The header fields the suite's calls carry.
const (
	keyField    = "x-key"    // the call's key
	costField   = "x-cost"   // its cost, when not 1
	exemptField = "x-exempt" // present: exempt
	planField   = "x-plan"   // the plan whose limiters check it
	blockField  = "x-block"  // present: the handler blocks
)

// suite is the Driver of a run, and whether its limiters check without
// coalescing (DisableCoalescing).
type suite struct {
	Driver
	perCheck bool
}

// Run runs every case of the suite against the adapter of d, each in a
// parallel subtest on a schema of its own, with limiters that coalesce
// their checks and with limiters that do not.
func Run(t *testing.T, d Driver) {
	for _, perCheck := range []bool{false, true} {
		name := "coalescing"
		if perCheck {
			name = "per-check"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run(t, suite{d, perCheck})
		})
	}
}

func run(t *testing.T, d suite) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, suite)
	}{
		{"Allowed", testAllowed},
		{"Denied", testDenied},
		{"DefaultKey", testDefaultKey},
		{"Refused", testRefused},
		{"Exempt", testExempt},
		{"ExemptTouchesNothing", testExemptTouchesNothing},
		{"Cost", testCost},
		{"FailClosedAndOpen", testFailClosedAndOpen},
		{"CheckTimeout", testCheckTimeout},
		{"Shadow", testShadow},
		{"ShadowFailures", testShadowFailures},
		{"Semaphore", testSemaphore},
		{"SemaphoreWithLimiter", testSemaphoreWithLimiter},
		{"LimitersPerCall", testLimitersPerCall},
		{"SeveralLimiters", testSeveralLimiters},
		{"InvalidConfig", testInvalidConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, d)
		})
	}
}

// fixed is a fixed clock on the buckets' grid: every field is exact.
func fixed() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) }

// errNoKey is the error of byKey for a call without x-key.
var errNoKey = errors.New("no x-key")

// byKey keys a call by its x-key field.
func byKey(r Request) (string, error) {
	if k := r.Get(keyField); k != "" {
		return k, nil
	}
	return "", errNoKey
}

// byCost costs a call its x-cost field, 1 without one.
func byCost(r Request) int64 {
	n, err := strconv.ParseInt(r.Get(costField), 10, 64)
	if err != nil {
		return 1
	}
	return n
}

// newLimiter is a limiter of cfg on pool, in the suite's mode.
func (d suite) newLimiter(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	cfg.DisableCoalescing = d.perCheck
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// limiter is a limiter of prefix on a fresh schema, on the fixed clock:
// capacity n, one token back every interval.
func (d suite) limiter(t *testing.T, prefix string, n int64, interval time.Duration) *pgratelimit.Limiter {
	t.Helper()
	return d.newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: prefix, Capacity: n, Refill: 1, Interval: interval, Clock: fixed})
}

// broken is a limiter whose database has no tables: every check fails.
func (d suite) broken(t *testing.T) *pgratelimit.Limiter {
	t.Helper()
	return d.newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
}

// dead is a limiter whose database address has nothing listening: every
// check fails to connect.
func (d suite) dead(t *testing.T) *pgratelimit.Limiter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	pool, err := pgxpool.New(context.Background(), "postgres://user@"+addr+"/db?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return d.newLimiter(t, pool, pgratelimit.Config{Prefix: "d", Capacity: 1, Refill: 1, Interval: time.Hour})
}

func serve(t *testing.T, d Driver, cfg Config, limiters ...*pgratelimit.Limiter) Client {
	t.Helper()
	c, err := d.Serve(t, cfg, func(Request) {}, limiters...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// want fails the test unless r has status s and the rate-limit fields
// policy, rateLimit and retryAfter.
func want(t *testing.T, what string, r Response, s Status, policy, rateLimit, retryAfter string) {
	t.Helper()
	if r.Status != s || r.Policy != policy || r.RateLimit != rateLimit || r.RetryAfter != retryAfter {
		t.Fatalf("%s: %s (%s) with RateLimit-Policy %q, RateLimit %q, Retry-After %q; want %s with %q, %q, %q",
			what, r.Status, r.Raw, r.Policy, r.RateLimit, r.RetryAfter, s, policy, rateLimit, retryAfter)
	}
}

// remaining is the tokens left of key's bucket of l.
func remaining(t *testing.T, l *pgratelimit.Limiter, key string) int64 {
	t.Helper()
	r, err := l.Peek(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return r.Remaining
}

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

// count is how many of lines contain s.
func count(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

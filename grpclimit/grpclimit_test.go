package grpclimit_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

// t0 is a fixed clock: the buckets' grid starts at it, so every field is
// exact.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func fixed() time.Time { return t0 }

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

// serve starts a gRPC server with the standard health service on a loopback
// TCP listener, and returns a client of it.
func serve(t *testing.T, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func withBoth(l *pgratelimit.Limiter, opts ...grpclimit.Option) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(l, opts...)),
		grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(l, opts...)),
	}
}

// check makes a unary call and returns its header metadata and error.
func check(c healthpb.HealthClient, md ...string) (metadata.MD, error) {
	ctx := context.Background()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	var h metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&h))
	return h, err
}

func requireFields(t *testing.T, h metadata.MD, want map[string]string) {
	t.Helper()
	for _, k := range []string{"ratelimit-policy", "ratelimit", "retry-after"} {
		got := strings.Join(h.Get(k), "|")
		if got != want[k] {
			t.Fatalf("%s: %q, want %q (all: %v)", k, got, want[k], h)
		}
	}
}

// retryDelay is the RetryInfo detail of a ResourceExhausted status.
func retryDelay(t *testing.T, err error) time.Duration {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("status %v, want ResourceExhausted", st)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("no RetryInfo in %v", st.Details())
	return 0
}

// Allowed calls carry the RateLimit fields in their header metadata; the
// denied one ends with ResourceExhausted, the exact delay in RetryInfo and
// retry-after in the metadata; unary calls and streams alike.
func TestUnaryAndStream(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "g", Capacity: 2, Refill: 1, Interval: 10 * time.Second, Clock: fixed, DisableCoalescing: off})
		c := serve(t, withBoth(l)...)
		policy := `"g";q=2;w=20`

		h, err := check(c)
		if err != nil {
			t.Fatal(err)
		}
		requireFields(t, h, map[string]string{"ratelimit-policy": policy, "ratelimit": `"g";r=1;t=10`})

		// A stream takes a token when it opens.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("first message of an allowed stream: %v", err)
		}
		h, err = s.Header()
		if err != nil {
			t.Fatal(err)
		}
		requireFields(t, h, map[string]string{"ratelimit-policy": policy, "ratelimit": `"g";r=0;t=20`})
		cancel()

		h, err = check(c)
		if d := retryDelay(t, err); d != 10*time.Second {
			t.Fatalf("RetryInfo delay %s, want 10s", d)
		}
		if msg := status.Convert(err).Message(); !strings.Contains(msg, `rate limit "g" exceeded, retry after 10s`) {
			t.Fatalf("message %q", msg)
		}
		denied := map[string]string{"ratelimit-policy": policy, "ratelimit": `"g";r=0;t=20`, "retry-after": "10"}
		requireFields(t, h, denied)

		s, err = c.Watch(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		if d := retryDelay(t, err); d != 10*time.Second {
			t.Fatalf("stream: RetryInfo delay %s, want 10s", d)
		}
		h, err = s.Header()
		if err != nil {
			t.Fatal(err)
		}
		requireFields(t, h, denied)
	})
}

// WithCost weighs calls; KeyByMetadata, KeyByMethod and KeyByPeer with
// trusted proxies key them as documented; a call without a key, or with a
// cost above the capacity, is InvalidArgument.
func TestKeysAndCost(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	l := newLimiter(t, pool, pgratelimit.Config{Prefix: "k", Capacity: 5, Refill: 1, Interval: time.Hour, Clock: fixed})
	remaining := func(key string) int64 {
		t.Helper()
		r, err := l.Peek(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining
	}
	cost := grpclimit.WithCost(func(_ context.Context, method string) int64 {
		if method == healthpb.Health_Check_FullMethodName {
			return 2
		}
		return 1
	})

	c := serve(t, withBoth(l, grpclimit.WithKeyFunc(grpclimit.KeyByMetadata("x-api-key")), cost)...)
	if _, err := check(c, "x-api-key", "secret"); err != nil {
		t.Fatal(err)
	}
	// sha256("secret"), as httplimit.KeyByHeader stores it.
	if r := remaining("hdr:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"); r != 3 {
		t.Fatalf("metadata key: %d remaining, want 3", r)
	}
	if _, err := check(c); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no x-api-key: %v", err)
	}

	c = serve(t, withBoth(l, grpclimit.WithKeyFunc(grpclimit.KeyByMethod()))...)
	if _, err := check(c); err != nil {
		t.Fatal(err)
	}
	if r := remaining("method:" + healthpb.Health_Check_FullMethodName); r != 4 {
		t.Fatalf("method key: %d remaining, want 4", r)
	}

	trusted := httplimit.IPKeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	c = serve(t, withBoth(l, grpclimit.WithKeyFunc(grpclimit.KeyByPeer(trusted)))...)
	if _, err := check(c, "x-forwarded-for", "1.1.1.1, 198.51.100.7"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:198.51.100.7"); r != 4 {
		t.Fatalf("forwarded peer key: %d remaining, want 4", r)
	}

	c = serve(t, withBoth(l, grpclimit.WithCost(func(context.Context, string) int64 { return 6 }))...)
	if _, err := check(c); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("cost above capacity: %v", err)
	}
	// The default key: the peer, trusting no proxy.
	c = serve(t, withBoth(l)...)
	if _, err := check(c, "x-forwarded-for", "198.51.100.8"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:127.0.0.1"); r != 4 {
		t.Fatalf("peer key: %d remaining, want 4", r)
	}
}

// A database that fails (here: without the tables) fails calls closed with
// Unavailable, or open with WithFailOpen: the call goes through without
// rate-limit metadata.
func TestFailClosedAndOpen(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		quiet := grpclimit.WithLogger(slog.New(slog.DiscardHandler))
		c := serve(t, withBoth(broken, quiet)...)
		if _, err := check(c); status.Code(err) != codes.Unavailable {
			t.Fatalf("fail closed: %v", err)
		}
		c = serve(t, withBoth(broken, quiet, grpclimit.WithFailOpen())...)
		h, err := check(c)
		if err != nil {
			t.Fatalf("fail open: %v", err)
		}
		requireFields(t, h, nil)
	})
}

// records is a slog handler that keeps what it is given.
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

// In shadow mode every call goes through without rate-limit metadata; the
// checks spend as enforced ones would, would-be denials are logged, and a
// failing database denies nothing either.
func TestShadow(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "sh", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed, DisableCoalescing: off})
		logs := &records{}
		c := serve(t, withBoth(l, grpclimit.WithShadow(), grpclimit.WithLogger(slog.New(logs)))...)
		for i := range 3 {
			h, err := check(c)
			if err != nil {
				t.Fatalf("call %d in shadow mode: %v", i, err)
			}
			requireFields(t, h, nil)
		}
		s, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("stream in shadow mode: %v", err)
		}
		want := "WARN grpclimit: shadow: would deny method=/grpc.health.v1.Health/"
		got := logs.get()
		if len(got) != 3 {
			t.Fatalf("logs %q, want 3 would-be denials", got)
		}
		for _, line := range got {
			if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, " key=ip:127.0.0.1 prefix=sh retry_after=10s") {
				t.Fatalf("log line %q", line)
			}
		}
		// Enforced now: the first shadow call took the only token.
		if _, err := check(serve(t, withBoth(l)...)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("enforced after shadow: %v", err)
		}

		broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		c = serve(t, withBoth(broken, grpclimit.WithShadow(), grpclimit.WithLogger(slog.New(slog.DiscardHandler)))...)
		if _, err := check(c); err != nil {
			t.Fatalf("shadow mode, failing database: %v", err)
		}
	})
}

// go-grpc-middleware's chain with MiddlewareLimiter: allowed calls carry
// the fields, a denied one is ResourceExhausted with our message quoted.
func TestMiddlewareLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "mw", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	ml := grpclimit.MiddlewareLimiter(l)
	c := serve(t,
		grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(ml)),
		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(ml)))
	h, err := check(c)
	if err != nil {
		t.Fatal(err)
	}
	requireFields(t, h, map[string]string{"ratelimit-policy": `"mw";q=1;w=10`, "ratelimit": `"mw";r=0;t=10`})
	h, err = check(c)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry after 10s") {
		t.Fatalf("denied: %v", err)
	}
	requireFields(t, h, map[string]string{"ratelimit-policy": `"mw";q=1;w=10`, "ratelimit": `"mw";r=0;t=10`, "retry-after": "10"})
	s, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("denied stream: %v", err)
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

// Against a database that accepts connections and never answers, a call is
// answered within the check timeout: Unavailable failing closed, the
// handler's answer failing open; and within DefaultCheckTimeout by default.
func TestCheckTimeout(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, silentPool(t), pgratelimit.Config{Prefix: "t", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		quiet := grpclimit.WithLogger(slog.New(slog.DiscardHandler))
		short := 200 * time.Millisecond
		for _, tc := range []struct {
			name  string
			opts  []grpclimit.Option
			bound time.Duration
			code  codes.Code
		}{
			{"closed", []grpclimit.Option{quiet, grpclimit.WithCheckTimeout(short)}, short, codes.Unavailable},
			{"open", []grpclimit.Option{quiet, grpclimit.WithCheckTimeout(short), grpclimit.WithFailOpen()}, short, codes.OK},
			{"default", []grpclimit.Option{quiet}, grpclimit.DefaultCheckTimeout, codes.Unavailable},
		} {
			c := serve(t, withBoth(l, tc.opts...)...)
			// The client's own deadline is only a failsafe, far past the
			// bound: the server must answer first.
			ctx, cancel := context.WithTimeout(context.Background(), tc.bound+30*time.Second)
			start := time.Now()
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			took := time.Since(start)
			cancel()
			if status.Code(err) != tc.code {
				t.Fatalf("%s: %v, want %s", tc.name, err, tc.code)
			}
			// Not before the bound; then at once, or within a few seconds on a
			// busy machine under -race: long before the failsafe.
			if took < tc.bound || took > tc.bound+5*time.Second {
				t.Fatalf("%s: answered in %s, bound %s", tc.name, took, tc.bound)
			}
		}
	})
}

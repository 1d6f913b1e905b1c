package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
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

// withBoth is the server options of an Interceptor of cfg and l, for unary
// calls and streams.
func withBoth(t *testing.T, l *pgratelimit.Limiter, cfg grpclimit.Config) []grpc.ServerOption {
	t.Helper()
	limit, err := grpclimit.NewInterceptor(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	return []grpc.ServerOption{grpc.UnaryInterceptor(limit.Unary), grpc.StreamInterceptor(limit.Stream)}
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
		c := serve(t, withBoth(t, l, grpclimit.Config{})...)
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

// Cost weighs calls by method; KeyByMetadata, KeyByMethod and KeyByPeer
// with trusted proxies key them as documented; a call without a key is
// InvalidArgument.
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
	cost := func(_ context.Context, method string) int64 {
		if method == healthpb.Health_Check_FullMethodName {
			return 2
		}
		return 1
	}

	c := serve(t, withBoth(t, l, grpclimit.Config{KeyFunc: grpclimit.KeyByMetadata("x-api-key"), Cost: cost})...)
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

	c = serve(t, withBoth(t, l, grpclimit.Config{KeyFunc: grpclimit.KeyByMethod()})...)
	if _, err := check(c); err != nil {
		t.Fatal(err)
	}
	if r := remaining("method:" + healthpb.Health_Check_FullMethodName); r != 4 {
		t.Fatalf("method key: %d remaining, want 4", r)
	}

	trusted := grpclimit.IPKeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	c = serve(t, withBoth(t, l, grpclimit.Config{KeyFunc: grpclimit.KeyByPeer(trusted)})...)
	if _, err := check(c, "x-forwarded-for", "1.1.1.1, 198.51.100.7"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:198.51.100.7"); r != 4 {
		t.Fatalf("forwarded peer key: %d remaining, want 4", r)
	}

	// The default key: the peer, trusting no proxy.
	c = serve(t, withBoth(t, l, grpclimit.Config{})...)
	if _, err := check(c, "x-forwarded-for", "198.51.100.8"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:127.0.0.1"); r != 4 {
		t.Fatalf("peer key: %d remaining, want 4", r)
	}
}

// go-grpc-middleware's chain with MiddlewareLimiter: allowed calls carry
// the fields, a denied one is ResourceExhausted with our message quoted.
func TestMiddlewareLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "mw", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	ml, err := grpclimit.MiddlewareLimiter(grpclimit.Config{}, l)
	if err != nil {
		t.Fatal(err)
	}
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
	// The chain cannot hold a lease for a call: a Semaphore is refused.
	sem, err := pgratelimit.NewSemaphore(testdb.Pool(t), pgratelimit.SemaphoreConfig{Prefix: "s", Max: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grpclimit.MiddlewareLimiter(grpclimit.Config{Semaphore: sem}, l); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
		t.Fatalf("a Semaphore: %v, want ErrInvalidConfig", err)
	}
}

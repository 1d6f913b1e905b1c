package grpclimit_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// watch opens a Watch stream, reads its first message and returns the
// stream's header metadata.
func watch(t *testing.T, c healthpb.HealthClient) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return nil, err
	}
	if _, err := s.Recv(); err != nil {
		return nil, err
	}
	return s.Header()
}

// Exempt streams go on unchecked, without rate-limit metadata, and spend
// nothing: the bucket is whole for the first checked call, and the exempt
// stream still opens once the others are denied.
func TestExemptStream(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "ex", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed})
	c := serve(t, withBoth(l, grpclimit.WithExempt(grpclimit.ExemptMethods(healthpb.Health_Watch_FullMethodName)))...)
	for i := range 3 {
		h, err := watch(t, c)
		if err != nil {
			t.Fatalf("exempt stream %d: %v", i, err)
		}
		requireFields(t, h, nil)
	}
	h, err := check(c)
	if err != nil {
		t.Fatalf("first checked call: %v", err)
	}
	requireFields(t, h, map[string]string{"ratelimit-policy": `"ex";q=1;w=10`, "ratelimit": `"ex";r=0;t=10`})
	if _, err := check(c); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second checked call: %v", err)
	}
	h, err = watch(t, c)
	if err != nil {
		t.Fatalf("exempt stream while denied: %v", err)
	}
	requireFields(t, h, nil)
}

// An exempt call never reaches the limiter, nor the key and cost functions:
// it goes on with a database that fails closed, in shadow mode without a
// log, through MiddlewareLimiter too; a whole service is exempted by its
// name, and a method of another service is checked.
func TestExemptTouchesNothing(t *testing.T) {
	t.Parallel()
	broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
	var asked atomic.Int64
	logs := &records{}
	opts := []grpclimit.Option{
		grpclimit.WithKeyFunc(func(context.Context, string) (string, error) { asked.Add(1); return "k", nil }),
		grpclimit.WithCost(func(context.Context, string) int64 { asked.Add(1); return 1 }),
		grpclimit.WithLogger(slog.New(logs)),
	}
	with := func(more ...grpclimit.Option) []grpclimit.Option {
		return append(append([]grpclimit.Option(nil), opts...), more...)
	}
	c := serve(t, withBoth(broken, with(grpclimit.WithExempt(grpclimit.ExemptMethods("grpc.health.v1.Health/Check")))...)...)
	h, err := check(c)
	if err != nil {
		t.Fatalf("exempt call with a failing database: %v", err)
	}
	requireFields(t, h, nil)
	if n := asked.Load(); n != 0 {
		t.Fatalf("key or cost asked %d times for an exempt call", n)
	}
	if _, err := watch(t, c); status.Code(err) != codes.Unavailable {
		t.Fatalf("a stream not exempt: %v, want it checked (Unavailable)", err)
	}

	service := grpclimit.WithExempt(grpclimit.ExemptMethods("grpc.health.v1.Health", "/other.v1.Other/Ping"))
	for name, c := range map[string]healthpb.HealthClient{
		"shadow": serve(t, withBoth(broken, with(service, grpclimit.WithShadow())...)...),
		"MiddlewareLimiter": serve(t,
			grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(grpclimit.MiddlewareLimiter(broken, with(service)...))),
			grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(grpclimit.MiddlewareLimiter(broken, with(service)...)))),
		"service": serve(t, withBoth(broken, with(service)...)...),
	} {
		h, err := check(c)
		if err != nil {
			t.Fatalf("%s: exempt call: %v", name, err)
		}
		requireFields(t, h, nil)
		if h, err = watch(t, c); err != nil {
			t.Fatalf("%s: exempt stream: %v", name, err)
		}
		requireFields(t, h, nil)
	}
	if n := asked.Load(); n != 2 {
		t.Fatalf("key and cost asked %d times, want once each (for the stream not exempt)", n)
	}
	if got := logs.get(); len(got) != 1 {
		t.Fatalf("logs %q, want only the failure of the stream not exempt", got)
	}
}

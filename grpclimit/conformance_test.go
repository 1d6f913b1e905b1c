package grpclimit_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/internal/middleware/middlewaretest"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// TestConformance runs the middleware conformance suite against
// NewInterceptor's unary interceptor.
func TestConformance(t *testing.T) { middlewaretest.Run(t, driver{}) }

// driver serves a health service through an Interceptor on a loopback
// listener: codes OK, ResourceExhausted, InvalidArgument and Unavailable
// are the suite's OK, Denied, Invalid and Unavailable.
type driver struct{}

func (driver) PeerKey() string { return "ip:127.0.0.1" }

// md is a call's incoming metadata, as the suite reads it.
type md metadata.MD

func (m md) Get(name string) string {
	if vs := metadata.MD(m).Get(name); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func request(ctx context.Context) middlewaretest.Request {
	m, _ := metadata.FromIncomingContext(ctx)
	return md(m)
}

func (driver) Serve(t *testing.T, cfg middlewaretest.Config, handle func(middlewaretest.Request), limiters ...*pgratelimit.Limiter) (middlewaretest.Client, error) {
	c := grpclimit.Config{Semaphore: cfg.Semaphore, FailOpen: cfg.FailOpen, Shadow: cfg.Shadow, CheckTimeout: cfg.CheckTimeout, Logger: cfg.Logger}
	if cfg.KeyFunc != nil {
		c.KeyFunc = func(ctx context.Context, _ string) (string, error) { return cfg.KeyFunc(request(ctx)) }
	}
	if cfg.Limiters != nil {
		c.Limiters = func(ctx context.Context, _, key string) ([]*pgratelimit.Limiter, error) {
			return cfg.Limiters(request(ctx), key)
		}
	}
	if cfg.Cost != nil {
		c.Cost = func(ctx context.Context, _ string) int64 { return cfg.Cost(request(ctx)) }
	}
	if cfg.Exempt != nil {
		c.Exempt = func(ctx context.Context, _ string) bool { return cfg.Exempt(request(ctx)) }
	}
	if cfg.Weight != nil {
		c.Weight = func(ctx context.Context, _ string) int64 { return cfg.Weight(request(ctx)) }
	}
	limit, err := grpclimit.NewInterceptor(c, limiters...)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(limit.Unary))
	healthpb.RegisterHealthServer(srv, healthService{handle: handle})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return client{healthpb.NewHealthClient(conn)}, nil
}

// healthService is a health service whose Check calls handle.
type healthService struct {
	healthpb.UnimplementedHealthServer
	handle func(middlewaretest.Request)
}

func (h healthService) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.handle(request(ctx))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

type client struct{ c healthpb.HealthClient }

func (c client) Do(t *testing.T, kv ...string) middlewaretest.Response {
	var h metadata.MD
	_, err := c.c.Check(metadata.AppendToOutgoingContext(t.Context(), kv...), &healthpb.HealthCheckRequest{}, grpc.Header(&h))
	st := status.Convert(err)
	first := func(k string) string {
		if vs := h.Get(k); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
	r := middlewaretest.Response{Raw: st.Code().String(), Policy: first("ratelimit-policy"), RateLimit: first("ratelimit"), RetryAfter: first("retry-after")}
	switch st.Code() {
	case codes.OK:
		r.Status = middlewaretest.OK
	case codes.ResourceExhausted:
		r.Status = middlewaretest.Denied
	case codes.InvalidArgument:
		r.Status = middlewaretest.Invalid
	case codes.Unavailable:
		r.Status = middlewaretest.Unavailable
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			r.RetryDelay, r.HasRetryInfo = ri.GetRetryDelay().AsDuration(), true
		}
	}
	return r
}

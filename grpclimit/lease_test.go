package grpclimit_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// slowHealth is a health service whose Check of service "slow" and Watch
// block until gate is closed (started is told when they begin), and whose
// Check of "panic" panics.
type slowHealth struct {
	healthpb.UnimplementedHealthServer
	started chan struct{}
	gate    chan struct{}
}

func (h *slowHealth) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.Service {
	case "slow":
		h.started <- struct{}{}
		<-h.gate
	case "panic":
		panic("boom")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *slowHealth) Watch(_ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	h.started <- struct{}{}
	<-h.gate
	return s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// recoverUnary turns a handler's panic into codes.Internal, as a recovery
// interceptor at the head of a chain does.
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (_ any, err error) {
	defer func() {
		if recover() != nil {
			err = status.Error(codes.Internal, "panic")
		}
	}()
	return handler(ctx, req)
}

// leases waits until key's leases number n.
func leases(t *testing.T, s *pgratelimit.Semaphore, key string, n int) []pgratelimit.Lease {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ls, err := s.Leases(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == n {
			return ls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d leases, want %d", key, len(ls), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A stream holds a lease of its key while it is open (the conformance
// suite has the unary calls'); a handler's panic, recovered further up the
// chain, releases its call's lease.
func TestSemaphoreStream(t *testing.T) {
	t.Parallel()
	s, err := pgratelimit.NewSemaphore(testdb.Pool(t), pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 1, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := grpclimit.NewInterceptor(grpclimit.Config{
		KeyFunc:   func(context.Context, string) (string, error) { return "k", nil },
		Semaphore: s,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &slowHealth{started: make(chan struct{}, 1), gate: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverUnary, limit.Unary), grpc.StreamInterceptor(limit.Stream))
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := healthpb.NewHealthClient(conn)
	call := func(service string, md ...string) (metadata.MD, error) {
		var hdr metadata.MD
		ctx := metadata.AppendToOutgoingContext(context.Background(), md...)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Header(&hdr))
		return hdr, err
	}

	// A stream holds its lease while it is open.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	leases(t, s, "k", 1)
	if _, err := call(""); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call while the stream is open: %v", err)
	}
	h.gate <- struct{}{}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	leases(t, s, "k", 0)

	if _, err := call("panic"); status.Code(err) != codes.Internal {
		t.Fatalf("panicking call: %v", err)
	}
	leases(t, s, "k", 0)
}

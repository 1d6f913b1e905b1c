package connectlimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pgratelimit/pgratelimit/connectlimit"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

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
// suite has the unary calls'); a handler's panic, recovered by Connect,
// releases its call's lease.
func TestSemaphoreStream(t *testing.T) {
	t.Parallel()
	s, err := pgratelimit.NewSemaphore(testdb.Pool(t), pgratelimit.SemaphoreConfig{Prefix: "conc", Max: 1, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in := interceptor(t, connectlimit.Config{
		KeyFunc:   func(context.Context, connectlimit.Call) (string, error) { return "k", nil },
		Semaphore: s,
	})
	started, gate := make(chan struct{}, 1), make(chan struct{})
	opts := []connect.HandlerOption{connect.WithInterceptors(in),
		connect.WithRecover(func(context.Context, connect.Spec, http.Header, any) error {
			return connect.NewError(connect.CodeInternal, errors.New("panic"))
		})}
	mux := http.NewServeMux()
	mux.Handle(echo, connect.NewUnaryHandler(echo, func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		switch req.Msg.Value {
		case "slow":
			started <- struct{}{}
			<-gate
		case "panic":
			panic("boom")
		}
		return connect.NewResponse(req.Msg), nil
	}, opts...))
	mux.Handle(count, connect.NewServerStreamHandler(count, func(_ context.Context, _ *connect.Request[wrapperspb.Int64Value], st *connect.ServerStream[wrapperspb.Int64Value]) error {
		started <- struct{}{}
		<-gate
		return st.Send(wrapperspb.Int64(0))
	}, opts...))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	echoc := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+echo)
	countc := connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](srv.Client(), srv.URL+count)
	call := func(v string, kv ...string) (http.Header, error) {
		req := connect.NewRequest(wrapperspb.String(v))
		for i := 0; i+1 < len(kv); i += 2 {
			req.Header().Add(kv[i], kv[i+1])
		}
		res, err := echoc.CallUnary(context.Background(), req)
		var ce *connect.Error
		switch {
		case errors.As(err, &ce):
			return ce.Meta(), err
		case err != nil:
			return nil, err
		}
		return res.Header(), nil
	}

	done := make(chan error, 1)
	// A stream holds its lease while it is open (its client waits for the
	// response headers, which come with its first message).
	go func() {
		st, err := countc.CallServerStream(context.Background(), connect.NewRequest(wrapperspb.Int64(1)))
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
			st.Close()
		}
		done <- err
	}()
	<-started
	leases(t, s, "k", 1)
	if _, err := call("hi"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("call while the stream is open: %v", err)
	}
	gate <- struct{}{}
	if err := <-done; err != nil {
		t.Fatalf("stream: %v", err)
	}
	leases(t, s, "k", 0)

	if _, err := call("panic"); connect.CodeOf(err) != connect.CodeInternal {
		t.Fatalf("panicking call: %v", err)
	}
	leases(t, s, "k", 0)
}

package connectlimit_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pgratelimit/pgratelimit/connectlimit"
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

// interceptor is NewInterceptor(cfg, limiters...), failing the test on an
// error.
func interceptor(t *testing.T, cfg connectlimit.Config, limiters ...*pgratelimit.Limiter) connect.Interceptor {
	t.Helper()
	in, err := connectlimit.NewInterceptor(cfg, limiters...)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func newLimiter(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

const (
	echo  = "/test.v1.Test/Echo"
	count = "/test.v1.Test/Count"
)

// client calls the test service: a unary Echo and a server-streaming Count.
type client struct {
	echo  *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]
	count *connect.Client[wrapperspb.Int64Value, wrapperspb.Int64Value]
	http  *http.Client
	url   string
}

// serve starts the test service on a loopback HTTP/2 (TLS) server whose
// handlers have the interceptors, and returns a client of it speaking
// protocol ("connect", "grpc" or "grpcweb").
func serve(t *testing.T, protocol string, interceptors ...connect.Interceptor) client {
	t.Helper()
	mux := http.NewServeMux()
	opt := connect.WithInterceptors(interceptors...)
	mux.Handle(echo, connect.NewUnaryHandler(echo, func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		return connect.NewResponse(req.Msg), nil
	}, opt))
	mux.Handle(count, connect.NewServerStreamHandler(count, func(_ context.Context, req *connect.Request[wrapperspb.Int64Value], s *connect.ServerStream[wrapperspb.Int64Value]) error {
		for i := range req.Msg.Value {
			if err := s.Send(wrapperspb.Int64(i)); err != nil {
				return err
			}
		}
		return nil
	}, opt))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	var opts []connect.ClientOption
	switch protocol {
	case "grpc":
		opts = append(opts, connect.WithGRPC())
	case "grpcweb":
		opts = append(opts, connect.WithGRPCWeb())
	}
	return client{
		echo:  connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+echo, opts...),
		count: connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](srv.Client(), srv.URL+count, opts...),
		http:  srv.Client(),
		url:   srv.URL,
	}
}

// call makes a unary call with the header pairs kv, and returns the response
// headers, or the error's Meta.
func (c client) call(kv ...string) (http.Header, error) {
	req := connect.NewRequest(wrapperspb.String("hi"))
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header().Add(kv[i], kv[i+1])
	}
	res, err := c.echo.CallUnary(context.Background(), req)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return ce.Meta(), err
		}
		return nil, err
	}
	if res.Msg.Value != "hi" {
		return nil, errors.New("wrong answer: " + res.Msg.Value)
	}
	return res.Header(), nil
}

// stream opens a Count stream of 2 and returns its response headers, or its
// error's Meta, once it has ended.
func (c client) stream() (http.Header, error) {
	s, err := c.count.CallServerStream(context.Background(), connect.NewRequest(wrapperspb.Int64(2)))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	n := 0
	for s.Receive() {
		n++
	}
	if err := s.Err(); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return ce.Meta(), err
		}
		return nil, err
	}
	if n != 2 {
		return nil, errors.New("stream ended early")
	}
	return s.ResponseHeader(), nil
}

func requireFields(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
		if got := strings.Join(h.Values(k), "|"); got != want[k] {
			t.Fatalf("%s: %q, want %q (all: %v)", k, got, want[k], h)
		}
	}
}

// retryDelay is the RetryInfo detail of a CodeResourceExhausted error.
func retryDelay(t *testing.T, err error) time.Duration {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
		t.Fatalf("%v, want resource_exhausted", err)
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			t.Fatal(err)
		}
		if ri, ok := v.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("no RetryInfo in %v", ce.Details())
	return 0
}

// Allowed calls carry the RateLimit fields in their response headers; a
// denied one ends with CodeResourceExhausted, the fields and Retry-After in
// its Meta and the exact delay in RetryInfo; unary calls and streams alike,
// in each of Connect's protocols.
func TestUnaryAndStream(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		pool := testdb.Pool(t)
		for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
			l := newLimiter(t, pool, pgratelimit.Config{Prefix: protocol, Capacity: 2, Refill: 1, Interval: 10 * time.Second, Clock: fixed, DisableCoalescing: off})
			c := serve(t, protocol, interceptor(t, connectlimit.Config{}, l))
			policy := `"` + protocol + `";q=2;w=20`

			h, err := c.call()
			if err != nil {
				t.Fatalf("%s: %v", protocol, err)
			}
			requireFields(t, h, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"` + protocol + `";r=1;t=10`})
			h, err = c.stream()
			if err != nil {
				t.Fatalf("%s: %v", protocol, err)
			}
			requireFields(t, h, map[string]string{"RateLimit-Policy": policy, "RateLimit": `"` + protocol + `";r=0;t=20`})

			denied := map[string]string{"RateLimit-Policy": policy, "RateLimit": `"` + protocol + `";r=0;t=20`, "Retry-After": "10"}
			h, err = c.call()
			if d := retryDelay(t, err); d != 10*time.Second {
				t.Fatalf("%s: RetryInfo delay %s, want 10s", protocol, d)
			}
			if !strings.Contains(err.Error(), `rate limit "`+protocol+`" exceeded, retry after 10s`) {
				t.Fatalf("%s: message %q", protocol, err)
			}
			requireFields(t, h, denied)
			h, err = c.stream()
			if d := retryDelay(t, err); d != 10*time.Second {
				t.Fatalf("%s: stream: RetryInfo delay %s, want 10s", protocol, d)
			}
			requireFields(t, h, denied)
		}
	})
}

// Cost weighs calls by procedure; KeyByHeader, KeyByProcedure and KeyByPeer
// with trusted proxies key them as documented; a call without a key is
// CodeInvalidArgument.
func TestKeysAndCost(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "k", Capacity: 5, Refill: 1, Interval: time.Hour, Clock: fixed})
	remaining := func(key string) int64 {
		t.Helper()
		r, err := l.Peek(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining
	}
	in := func(cfg connectlimit.Config) client { return serve(t, "connect", interceptor(t, cfg, l)) }
	cost := func(_ context.Context, call connectlimit.Call) int64 {
		if call.Spec.Procedure == echo {
			return 2
		}
		return 1
	}

	c := in(connectlimit.Config{KeyFunc: connectlimit.KeyByHeader("X-API-Key"), Cost: cost})
	if _, err := c.call("X-API-Key", "secret"); err != nil {
		t.Fatal(err)
	}
	// sha256("secret"), as httplimit.KeyByHeader stores it.
	if r := remaining("hdr:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"); r != 3 {
		t.Fatalf("header key: %d remaining, want 3", r)
	}
	if _, err := c.call(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("no X-API-Key: %v", err)
	}

	if _, err := in(connectlimit.Config{KeyFunc: connectlimit.KeyByProcedure()}).stream(); err != nil {
		t.Fatal(err)
	}
	if r := remaining("method:" + count); r != 4 {
		t.Fatalf("procedure key: %d remaining, want 4", r)
	}

	trusted := connectlimit.IPKeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := in(connectlimit.Config{KeyFunc: connectlimit.KeyByPeer(trusted)}).call("X-Forwarded-For", "1.1.1.1, 198.51.100.7"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:198.51.100.7"); r != 4 {
		t.Fatalf("forwarded peer key: %d remaining, want 4", r)
	}

	// The default key: the peer, trusting no proxy.
	if _, err := in(connectlimit.Config{}).call("X-Forwarded-For", "198.51.100.8"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:127.0.0.1"); r != 4 {
		t.Fatalf("peer key: %d remaining, want 4", r)
	}
}

// A database that fails (here: without the tables) fails streams closed
// with CodeUnavailable (the conformance suite has the unary calls'). On a
// client the interceptor checks nothing.
func TestFailClosedStreamAndClients(t *testing.T) {
	t.Parallel()
	broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour})
	in := interceptor(t, connectlimit.Config{Logger: slog.New(slog.DiscardHandler)}, broken)
	if _, err := serve(t, "connect", in).stream(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("fail closed, stream: %v", err)
	}
	// Clients with the interceptor (failing closed) calling a server
	// without it: nothing is checked.
	plain := serve(t, "connect")
	ic := connect.WithInterceptors(in)
	c := client{
		echo:  connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](plain.http, plain.url+echo, ic),
		count: connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](plain.http, plain.url+count, ic),
	}
	if _, err := c.call(); err != nil {
		t.Fatalf("client with the interceptor: %v", err)
	}
	if _, err := c.stream(); err != nil {
		t.Fatalf("streaming client with the interceptor: %v", err)
	}
}

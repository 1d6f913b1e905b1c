package connectlimit_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pgratelimit/pgratelimit/connectlimit"
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
			c := serve(t, protocol, connectlimit.NewInterceptor(l))
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

// WithCost weighs calls; KeyByHeader, KeyByProcedure and KeyByPeer with
// trusted proxies key them as documented; a call without a key, or with a
// cost above the capacity, is CodeInvalidArgument.
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
	in := func(opts ...connectlimit.Option) client {
		return serve(t, "connect", connectlimit.NewInterceptor(l, opts...))
	}
	cost := connectlimit.WithCost(func(_ context.Context, call connectlimit.Call) int64 {
		if call.Spec.Procedure == echo {
			return 2
		}
		return 1
	})

	c := in(connectlimit.WithKeyFunc(connectlimit.KeyByHeader("X-API-Key")), cost)
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

	if _, err := in(connectlimit.WithKeyFunc(connectlimit.KeyByProcedure())).stream(); err != nil {
		t.Fatal(err)
	}
	if r := remaining("method:" + count); r != 4 {
		t.Fatalf("procedure key: %d remaining, want 4", r)
	}

	trusted := httplimit.IPKeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := in(connectlimit.WithKeyFunc(connectlimit.KeyByPeer(trusted))).call("X-Forwarded-For", "1.1.1.1, 198.51.100.7"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:198.51.100.7"); r != 4 {
		t.Fatalf("forwarded peer key: %d remaining, want 4", r)
	}

	if _, err := in(connectlimit.WithCost(func(context.Context, connectlimit.Call) int64 { return 6 })).call(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("cost above capacity: %v", err)
	}
	// The default key: the peer, trusting no proxy.
	if _, err := in().call("X-Forwarded-For", "198.51.100.8"); err != nil {
		t.Fatal(err)
	}
	if r := remaining("ip:127.0.0.1"); r != 4 {
		t.Fatalf("peer key: %d remaining, want 4", r)
	}
}

// A database that fails (here: without the tables) fails calls closed with
// CodeUnavailable, or open with WithFailOpen: the call goes through without
// rate-limit headers. On a client the interceptor checks nothing.
func TestFailClosedAndOpen(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		quiet := connectlimit.WithLogger(slog.New(slog.DiscardHandler))
		c := serve(t, "connect", connectlimit.NewInterceptor(broken, quiet))
		if _, err := c.call(); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("fail closed: %v", err)
		}
		if _, err := c.stream(); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("fail closed, stream: %v", err)
		}
		c = serve(t, "connect", connectlimit.NewInterceptor(broken, quiet, connectlimit.WithFailOpen()))
		h, err := c.call()
		if err != nil {
			t.Fatalf("fail open: %v", err)
		}
		requireFields(t, h, nil)

		// Clients with the interceptor (failing closed) calling a server
		// without it: nothing is checked.
		plain := serve(t, "connect")
		ic := connect.WithInterceptors(connectlimit.NewInterceptor(broken, quiet))
		c = client{
			echo:  connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](plain.http, plain.url+echo, ic),
			count: connect.NewClient[wrapperspb.Int64Value, wrapperspb.Int64Value](plain.http, plain.url+count, ic),
		}
		if _, err := c.call(); err != nil {
			t.Fatalf("client with the interceptor: %v", err)
		}
		if _, err := c.stream(); err != nil {
			t.Fatalf("streaming client with the interceptor: %v", err)
		}
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

// In shadow mode every call goes through without rate-limit headers; the
// checks spend as enforced ones would, would-be denials are logged, and a
// failing database denies nothing either.
func TestShadow(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, testdb.Pool(t), pgratelimit.Config{Prefix: "sh", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: fixed, DisableCoalescing: off})
		logs := &records{}
		c := serve(t, "connect", connectlimit.NewInterceptor(l, connectlimit.WithShadow(), connectlimit.WithLogger(slog.New(logs))))
		for i := range 3 {
			h, err := c.call()
			if err != nil {
				t.Fatalf("call %d in shadow mode: %v", i, err)
			}
			requireFields(t, h, nil)
		}
		h, err := c.stream()
		if err != nil {
			t.Fatalf("stream in shadow mode: %v", err)
		}
		requireFields(t, h, nil)
		got := logs.get()
		if len(got) != 3 {
			t.Fatalf("logs %q, want 3 would-be denials", got)
		}
		for _, line := range got {
			if !strings.HasPrefix(line, "WARN connectlimit: shadow: would deny procedure=/test.v1.Test/") ||
				!strings.HasSuffix(line, " key=ip:127.0.0.1 prefix=sh retry_after=10s") {
				t.Fatalf("log line %q", line)
			}
		}
		// Enforced now: the first shadow call took the only token.
		if _, err := serve(t, "connect", connectlimit.NewInterceptor(l)).call(); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Fatalf("enforced after shadow: %v", err)
		}

		broken := newLimiter(t, testdb.NewEmptySchema(t).Pool(t, 0), pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		c = serve(t, "connect", connectlimit.NewInterceptor(broken, connectlimit.WithShadow(), connectlimit.WithLogger(slog.New(slog.DiscardHandler))))
		if _, err := c.call(); err != nil {
			t.Fatalf("shadow mode, failing database: %v", err)
		}
	})
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
// answered within the check timeout: CodeUnavailable failing closed, the
// handler's answer failing open; and within DefaultCheckTimeout by default.
func TestCheckTimeout(t *testing.T) {
	modes(t, func(t *testing.T, off bool) {
		l := newLimiter(t, silentPool(t), pgratelimit.Config{Prefix: "t", Capacity: 1, Refill: 1, Interval: time.Hour, DisableCoalescing: off})
		quiet := connectlimit.WithLogger(slog.New(slog.DiscardHandler))
		short := 200 * time.Millisecond
		for _, tc := range []struct {
			name  string
			opts  []connectlimit.Option
			bound time.Duration
			code  connect.Code
		}{
			{"closed", []connectlimit.Option{quiet, connectlimit.WithCheckTimeout(short)}, short, connect.CodeUnavailable},
			{"open", []connectlimit.Option{quiet, connectlimit.WithCheckTimeout(short), connectlimit.WithFailOpen()}, short, 0},
			{"default", []connectlimit.Option{quiet}, connectlimit.DefaultCheckTimeout, connect.CodeUnavailable},
		} {
			c := serve(t, "connect", connectlimit.NewInterceptor(l, tc.opts...))
			// The client's own deadline is only a failsafe, far past the
			// bound: the server must answer first.
			ctx, cancel := context.WithTimeout(context.Background(), tc.bound+30*time.Second)
			start := time.Now()
			_, err := c.echo.CallUnary(ctx, connect.NewRequest(wrapperspb.String("hi")))
			took := time.Since(start)
			cancel()
			if code := connect.CodeOf(err); (err == nil) != (tc.code == 0) || (err != nil && code != tc.code) {
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

// Package connectlimit rate-limits connectrpc.com/connect handlers with a
// pgratelimit.Limiter: an interceptor for unary and streaming handlers,
// whatever the protocol (Connect, gRPC, gRPC-Web).
//
// It is a module of its own, so that services importing only the library
// never download Connect or protobuf.
//
// # Calls and keys
//
// Each call is one check of the Limiter (a stream is checked once, when it
// opens; its messages are not counted) of the call's key and cost. The key
// is the peer's IP address by default (KeyByPeer with no trusted proxy, in
// httplimit's format "ip:ADDRESS", so a client shares its bucket with its
// plain HTTP requests), or the procedure (KeyByProcedure), an API key from a
// request header (KeyByHeader, hashed as httplimit.KeyByHeader does), or
// any KeyFunc of the call. The cost is 1 unless WithCost says otherwise.
//
// # Answers
//
// An allowed call goes on to the handler with the RateLimit-Policy and
// RateLimit response headers of the IETF draft that httplimit sends, with
// the same values:
//
//	RateLimit-Policy: "api";q=10;w=10
//	RateLimit: "api";r=7;t=3
//
// A denied call ends with connect.CodeResourceExhausted, the same fields and
// Retry-After (whole seconds, rounded up) in the error's Meta, which Connect
// sends as response headers, and a google.rpc.RetryInfo detail
// (errdetails.RetryInfo) whose RetryDelay is the exact wait. A call without a
// key, or with an invalid key or cost, ends with connect.CodeInvalidArgument.
//
// # Exemptions
//
// WithExempt lets calls through unchecked: a call it says is exempt is not
// keyed, costs nothing, never reaches the limiter and gets no rate-limit
// headers, in shadow mode too. ExemptProcedures exempts procedures or whole
// services by name, such as health checks and reflection:
//
//	connectlimit.WithExempt(connectlimit.ExemptProcedures("grpc.health.v1.Health",
//		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"))
//
// # Concurrency
//
// WithSemaphore makes each call, or each stream for as long as it is open,
// hold a lease of a pgratelimit.Semaphore for its key while its handler
// runs: "at most 5 calls in flight per client". The lease is taken with the
// limiter's tokens, all or nothing, extended every TTL/3 and released when
// the handler returns (also when it panics). A call that finds no free
// units ends with connect.CodeResourceExhausted and the same fields; exempt
// calls take no lease.
//
// # Failures and timeouts
//
// When the database fails, the interceptor fails closed with
// connect.CodeUnavailable by default, or open (the call goes on, without
// rate-limit headers) with WithFailOpen; either way the error is logged.
// Each check is bounded by WithCheckTimeout (DefaultCheckTimeout unless
// set), so a database that accepts connections and never answers costs a
// call at most that long. A call whose own context ends during the check
// ends with connect.CodeCanceled or connect.CodeDeadlineExceeded.
//
// # Shadow mode
//
// WithShadow rolls a limit out without enforcing it: every call is checked
// (an allowed check takes its tokens, a would-be denial writes nothing),
// would-be denials are logged at Warn with the key, the limiter's prefix and
// the retry delay, and counted with pgratelimit.shadow=true (see
// pgratelimit.WithShadow); every call goes on to its handler, without
// rate-limit headers, also when the check fails or the call has no key.
package connectlimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// Call is what a key or cost function can read of a call.
type Call struct {
	// Spec describes the procedure: Spec.Procedure is
	// "/package.Service/Method".
	Spec connect.Spec
	// Peer is the other party: Peer.Addr is its "ip:port".
	Peer connect.Peer
	// Header is the request's headers.
	Header http.Header
}

// KeyFunc returns the rate-limit key of a call. An error ends the call with
// connect.CodeInvalidArgument (in shadow mode, the call goes on). Keys are
// stored in plain text: hash anything secret.
type KeyFunc func(ctx context.Context, call Call) (string, error)

// ErrNoKey is returned by the key functions when a call carries nothing to
// key it by (an unparsable peer address, no such header).
var ErrNoKey = errors.New("connectlimit: no rate-limit key in call")

// KeyByPeer keys calls by the client's IP address as httplimit.KeyByIP does,
// from the peer's address and, when the peer is one of cfg.TrustedProxies,
// X-Forwarded-For: "ip:ADDRESS", or "ip:NETWORK/BITS" with cfg.IPv6Prefix.
func KeyByPeer(cfg httplimit.IPKeyConfig) KeyFunc {
	return func(_ context.Context, call Call) (string, error) {
		key, err := cfg.Key(call.Peer.Addr, call.Header.Values("X-Forwarded-For"))
		if err != nil {
			return "", fmt.Errorf("%w: peer address %q", ErrNoKey, call.Peer.Addr)
		}
		return key, nil
	}
}

// KeyByProcedure keys calls by procedure alone: one bucket per procedure,
// shared by every client (a global limit). The key is
// "method:/package.Service/Method", as grpclimit.KeyByMethod makes it, so a
// service moving between grpc-go and Connect keeps its buckets.
func KeyByProcedure() KeyFunc {
	return func(_ context.Context, call Call) (string, error) {
		return middleware.MethodKey(call.Spec.Procedure), nil
	}
}

// KeyByHeader keys calls by the value of the request header name (e.g.
// "X-API-Key"), stored as httplimit.KeyByHeader stores it ("hdr:" and the
// value's SHA-256 in hex), so the secret itself is never written and a
// client has one bucket over plain HTTP and Connect. A call without the
// header gets ErrNoKey.
func KeyByHeader(name string) KeyFunc {
	return func(_ context.Context, call Call) (string, error) {
		v := call.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
		}
		return middleware.SecretKey(v), nil
	}
}

// DefaultCheckTimeout is the bound on each check unless WithCheckTimeout
// sets another: far above a healthy check (a millisecond or a few), well
// below the deadlines of most clients.
const DefaultCheckTimeout = middleware.DefaultCheckTimeout

// An Option configures the interceptor.
type Option func(*options)

// options are the core's, for calls.
type options = middleware.Config[Call]

// WithKeyFunc sets how a call's key is found. Defaults to
// KeyByPeer(httplimit.IPKeyConfig{}): the direct peer's address, trusting no
// proxy.
func WithKeyFunc(f KeyFunc) Option {
	return func(o *options) { o.Key = f }
}

// WithExempt lets the calls that exempt reports true for through unchecked:
// no key, no check, no rate-limit headers, whatever the other options say,
// in shadow mode too. ExemptProcedures makes one for health checks and
// reflection. Defaults to none: every call is checked.
func WithExempt(exempt func(ctx context.Context, call Call) bool) Option {
	return func(o *options) { o.Exempt = exempt }
}

// ExemptProcedures returns a func for WithExempt that exempts the calls of
// names: procedures ("/package.Service/Method", the leading slash optional)
// or whole services ("package.Service", each of its procedures). For the
// standard health and reflection services (connectrpc.com/grpchealth and
// connectrpc.com/grpcreflect):
//
//	connectlimit.ExemptProcedures("grpc.health.v1.Health",
//		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
func ExemptProcedures(names ...string) func(ctx context.Context, call Call) bool {
	match := middleware.MatchMethods(names...)
	return func(_ context.Context, call Call) bool { return match(call.Spec.Procedure) }
}

// WithCost sets how many tokens a call takes, by procedure for example.
// Defaults to 1 for every call.
func WithCost(f func(ctx context.Context, call Call) int64) Option {
	return func(o *options) { o.Cost = f }
}

// WithFailOpen lets calls through, without rate-limit headers, when the
// limiter's database fails or does not answer within the check timeout.
// Without it the interceptor fails closed: connect.CodeUnavailable. Either
// way the error is logged.
func WithFailOpen() Option {
	return func(o *options) { o.FailOpen = true }
}

// WithShadow checks every call but denies none: would-be denials are logged
// (Warn) and counted with pgratelimit.shadow=true, and every call goes on to
// its handler without rate-limit headers, whatever the check says (also
// when it fails or the call has no key, logged too). Use it to roll a new
// limit out: shadow first, read the would-be denials, then enforce.
func WithShadow() Option {
	return func(o *options) { o.Shadow = true }
}

// WithSemaphore makes each call (each stream, for as long as it is open)
// hold a lease of weight units of sem for its key (the limiters' key) while
// its handler runs: taken in the same pgratelimit.AllowAll as the
// limiter's tokens (all or nothing), extended every TTL/3, released when
// the handler returns, also when it panics. A call that finds no free units
// is denied as the limiter denies one (connect.CodeResourceExhausted, with
// the rate-limit headers: the semaphore's policy is "name";q=Max and
// RateLimit reports it as "name";r=free). weight nil is 1 for every call.
// The limiter given to the interceptor may then be nil: concurrency alone.
// sem must use the limiter's pool.
func WithSemaphore(sem *pgratelimit.Semaphore, weight func(ctx context.Context, call Call) int64) Option {
	return func(o *options) {
		o.Semaphore = sem
		if weight != nil {
			o.Weight = weight
		}
	}
}

// WithLogger sets the logger of database errors and, in shadow mode, of
// would-be denials. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.Logger = l }
}

// WithCheckTimeout bounds each check, from taking a database connection to
// the answer: a check that takes longer fails closed
// (connect.CodeUnavailable) or open (WithFailOpen), so a database that
// accepts connections and never answers cannot hold calls. The call's own
// deadline still applies when it is sooner. Defaults to DefaultCheckTimeout;
// zero keeps the default and a negative d sets no bound but the call's
// context.
func WithCheckTimeout(d time.Duration) Option {
	return func(o *options) { o.CheckTimeout = d }
}

// NewInterceptor returns an interceptor that checks every call a handler
// receives against l, unary calls and streams alike (streams once, when they
// open), before it reaches the handler; on clients it does nothing. Give it
// to a handler with connect.WithInterceptors. See the package doc for keys,
// answers, failures and shadow mode.
func NewInterceptor(l *pgratelimit.Limiter, opts ...Option) connect.Interceptor {
	var limiters []*pgratelimit.Limiter
	if l != nil {
		limiters = []*pgratelimit.Limiter{l}
	}
	cfg := options{
		Name:     "connectlimit",
		Noun:     "call",
		Attrs:    func(call Call) []any { return []any{"procedure", call.Spec.Procedure} },
		Limiters: func(context.Context, Call, string) ([]*pgratelimit.Limiter, error) { return limiters, nil },
		// A call whose context ended gets CodeCanceled or
		// CodeDeadlineExceeded.
		ReportEnded: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Key == nil {
		cfg.Key = KeyByPeer(httplimit.IPKeyConfig{})
	}
	return &interceptor{core: middleware.New(cfg)}
}

type interceptor struct {
	core *middleware.Core[Call]
}

// WrapUnary checks a unary call before its handler; the fields of an
// allowed call are set on its response's headers, or on the handler's
// error's Meta when it returns a *connect.Error.
func (in *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		fields, release, err := in.check(ctx, Call{Spec: req.Spec(), Peer: req.Peer(), Header: req.Header()})
		defer release()
		if err != nil {
			return nil, err
		}
		res, err := next(ctx, req)
		var ce *connect.Error
		switch {
		case fields == nil:
		case err == nil && res != nil:
			fields.Set(res.Header())
		case errors.As(err, &ce):
			fields.Set(ce.Meta())
		}
		return res, err
	}
}

// WrapStreamingClient returns next: the interceptor checks calls on
// handlers only.
func (in *interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks a stream when it opens, before its handler;
// the fields of an allowed stream are set on its response headers.
func (in *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		fields, release, err := in.check(ctx, Call{Spec: conn.Spec(), Peer: conn.Peer(), Header: conn.RequestHeader()})
		defer release()
		if err != nil {
			return err
		}
		if fields != nil {
			fields.Set(conn.ResponseHeader())
		}
		return next(ctx, conn)
	}
}

// check checks a call. It returns the fields to send with an allowed call
// (nil for none), the func to call when the call has ended (never nil), or
// the error that ends the call.
func (in *interceptor) check(ctx context.Context, call Call) (*middleware.Fields, func(), error) {
	d, release := in.core.Check(ctx, call)
	fields, err := answer(d)
	return fields, release, err
}

// answer is the fields to send with decision d, or the error that ends the
// call.
func answer(d middleware.Decision) (*middleware.Fields, error) {
	switch d.Verdict {
	case middleware.Exempt, middleware.Pass:
		return nil, nil
	case middleware.Allow:
		return &d.Fields, nil
	case middleware.Deny:
		ce := connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("connectlimit: rate limit %q exceeded, retry after %s", d.Prefix(), d.Result.RetryAfter))
		d.Fields.Set(ce.Meta())
		if detail, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.Result.RetryAfter)}); err == nil {
			ce.AddDetail(detail)
		}
		return nil, ce
	case middleware.Invalid:
		return nil, connect.NewError(connect.CodeInvalidArgument, d.Err)
	case middleware.Ended:
		code := connect.CodeCanceled
		if errors.Is(d.Err, context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, d.Err)
	default: // Unavailable
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("connectlimit: rate limiter unavailable"))
	}
}

// Package connectlimit rate-limits connectrpc.com/connect handlers with
// pgratelimit limiters: an interceptor for unary and streaming handlers,
// whatever the protocol (Connect, gRPC, gRPC-Web).
//
// NewInterceptor(cfg, limiters...) builds it; Config's zero value checks
// every call against the limiters given, keyed by the peer's address.
// httplimit and grpclimit take a Config with the same fields, and answer
// alike.
//
// It is a module of its own, so that services importing only the library
// never download Connect or protobuf.
//
// # Calls and keys
//
// Each call is one check of the limiters, all at once (a stream is checked
// once, when it opens; its messages are not counted), of the call's key and
// cost; Config.Limiters picks the limiters per call (a plan). The key
// is the peer's IP address by default (KeyByPeer with no trusted proxy, in
// httplimit's format "ip:ADDRESS", so a client shares its bucket with its
// plain HTTP requests), or the procedure (KeyByProcedure), an API key from a
// request header (KeyByHeader, hashed as httplimit.KeyByHeader does), or
// any KeyFunc of the call. The cost is 1 unless Config.Cost says otherwise.
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
// key, whose Config.Limiters fails, or with an invalid key or cost, ends
// with connect.CodeInvalidArgument.
//
// # Exemptions
//
// Config.Exempt lets calls through unchecked: a call it says is exempt is not
// keyed, costs nothing, never reaches the limiter and gets no rate-limit
// headers, in shadow mode too. ExemptProcedures exempts procedures or whole
// services by name, such as health checks and reflection:
//
//	connectlimit.Config{Exempt: connectlimit.ExemptProcedures("grpc.health.v1.Health",
//		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")}
//
// # Concurrency
//
// Config.Semaphore makes each call, or each stream for as long as it is open,
// hold a lease of a pgratelimit.Semaphore for its key while its handler
// runs: "at most 5 calls in flight per client". The lease is taken with the
// limiters' tokens, all or nothing, extended every TTL/3 and released when
// the handler returns (also when it panics). A call that finds no free
// units ends with connect.CodeResourceExhausted and the same fields; exempt
// calls take no lease.
//
// # Failures and timeouts
//
// When the database fails, the interceptor fails closed with
// connect.CodeUnavailable by default, or open (the call goes on, without
// rate-limit headers) with Config.FailOpen; either way the error is
// logged. Each check is bounded by Config.CheckTimeout (DefaultCheckTimeout
// unless set), so a database that accepts connections and never answers costs a
// call at most that long. A call whose own context ends during the check
// ends with connect.CodeCanceled or connect.CodeDeadlineExceeded.
//
// # Shadow mode
//
// Config.Shadow rolls a limit out without enforcing it: every call is checked
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
	"net/netip"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
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

// IPKeyConfig configures KeyByPeer, as httplimit.IPKeyConfig configures
// httplimit.KeyByIP: a client has the same key over plain HTTP and Connect.
type IPKeyConfig struct {
	// TrustedProxies are the networks of your own proxies and load
	// balancers. X-Forwarded-For is believed only when the peer is in one
	// of them, and then read from the right, skipping trusted hops: the
	// first untrusted address is the client. Defaults to none: the peer is
	// the client.
	TrustedProxies []netip.Prefix

	// IPv6Prefix, when in 1..127, keys IPv6 clients by their network of
	// this many bits (64 groups a /64) instead of by address. Defaults to
	// 0: the whole address.
	IPv6Prefix int
}

// KeyByPeer keys calls by the client's IP address as httplimit.KeyByIP does,
// from the peer's address and, when the peer is one of cfg.TrustedProxies,
// X-Forwarded-For: "ip:ADDRESS", or "ip:NETWORK/BITS" with cfg.IPv6Prefix.
// A peer address that does not parse gets ErrNoKey.
func KeyByPeer(cfg IPKeyConfig) KeyFunc {
	c := middleware.IPKeyConfig(cfg)
	return func(_ context.Context, call Call) (string, error) {
		key, err := c.Key(call.Peer.Addr, call.Header.Values("X-Forwarded-For"))
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
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

// DefaultCheckTimeout is the bound on each check when Config.CheckTimeout
// is zero: far above a healthy check (a millisecond or a few), well below
// the deadlines of most clients.
const DefaultCheckTimeout = middleware.DefaultCheckTimeout

// Config configures NewInterceptor. Its zero value checks every call
// against the limiters given, keyed by the peer's address. The funcs are
// called with the call's context.
type Config struct {
	// KeyFunc picks the bucket of a call. Defaults to
	// KeyByPeer(IPKeyConfig{}): the direct peer's address, trusting no
	// proxy.
	KeyFunc KeyFunc

	// Limiters, when set, picks the limiters a call is checked against,
	// given its key (e.g. a plan looked up from the API key), all charged
	// at once, in place of those given to NewInterceptor. An error ends
	// the call with connect.CodeInvalidArgument, as a KeyFunc error does.
	// Defaults to nil: the limiters given.
	Limiters func(ctx context.Context, call Call, key string) ([]*pgratelimit.Limiter, error)

	// Cost is how many tokens a call takes of each limiter, by procedure
	// for example. Defaults to 1 for every call.
	Cost func(ctx context.Context, call Call) int64

	// Exempt, when it returns true, lets a call through unchecked: no key,
	// no check, no rate-limit headers, whatever the other fields say, in
	// shadow mode too. ExemptProcedures makes one for health checks and
	// reflection. Defaults to nil: every call is checked.
	Exempt func(ctx context.Context, call Call) bool

	// Semaphore, when set, makes each call (each stream, for as long as it
	// is open) hold a lease of its key (the limiters' key) while its
	// handler runs: taken in the same pgratelimit.AllowAll as the
	// limiters' tokens (all or nothing), extended every TTL/3, released
	// when the handler returns, also when it panics. A call that finds no
	// free units is denied as the limiters deny one
	// (connect.CodeResourceExhausted, with the rate-limit headers: the
	// semaphore's policy is "name";q=Max and RateLimit reports it as
	// "name";r=free). It must use the limiters' pool. Defaults to nil: no
	// lease.
	Semaphore *pgratelimit.Semaphore

	// Weight is how many units of the Semaphore a call's lease holds; set
	// without a Semaphore, it is an invalid Config. Defaults to 1 for
	// every call.
	Weight func(ctx context.Context, call Call) int64

	// FailOpen lets calls through, without rate-limit headers, when the
	// limiter's database fails or does not answer within the check
	// timeout. Defaults to false: fail closed with connect.CodeUnavailable.
	// Either way the error is logged.
	FailOpen bool

	// Shadow checks every call but denies none: would-be denials are
	// logged (Warn) and counted with pgratelimit.shadow=true, and every
	// call goes on to its handler without rate-limit headers, whatever the
	// check says (also when it fails or the call has no key, logged too).
	// Use it to roll a new limit out: shadow first, read the would-be
	// denials, then enforce. Defaults to false: enforce.
	Shadow bool

	// CheckTimeout bounds each check, from taking a database connection to
	// the answer: a check that takes longer fails closed
	// (connect.CodeUnavailable) or open (FailOpen), so a database that
	// accepts connections and never answers cannot hold calls. The call's
	// own deadline still applies when it is sooner. A negative value sets
	// no bound but the call's context. Defaults to DefaultCheckTimeout.
	CheckTimeout time.Duration

	// Logger receives database errors and, in shadow mode, the would-be
	// denials. Defaults to slog.Default().
	Logger *slog.Logger
}

// ExemptProcedures returns a Config.Exempt that exempts the calls of
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

// NewInterceptor returns an interceptor that checks every call a handler
// receives against limiters, all at once, in one pgratelimit.AllowAll,
// unary calls and streams alike (streams once, when they open), before it
// reaches the handler; on clients it does nothing. Config.Limiters, when
// set, picks the limiters per call instead; with Config.Semaphore there may
// be none (concurrency alone). Every limiter must use the same pool. Give
// it to a handler with connect.WithInterceptors. See the package doc for
// keys, answers, failures and shadow mode.
//
// A Config that cannot check anything (no limiter, no Config.Limiters, no
// Config.Semaphore), a nil limiter, or a Weight without a Semaphore is an
// error wrapping pgratelimit.ErrInvalidConfig: nothing is refused later,
// at call time, for the Config's sake.
func NewInterceptor(cfg Config, limiters ...*pgratelimit.Limiter) (connect.Interceptor, error) {
	if cfg.KeyFunc == nil {
		cfg.KeyFunc = KeyByPeer(IPKeyConfig{})
	}
	core, err := middleware.New(middleware.Config[Call]{
		Name:         "connectlimit",
		Noun:         "call",
		Attrs:        func(call Call) []any { return []any{"procedure", call.Spec.Procedure} },
		Key:          cfg.KeyFunc,
		Limiters:     cfg.Limiters,
		Cost:         cfg.Cost,
		Exempt:       cfg.Exempt,
		Semaphore:    cfg.Semaphore,
		Weight:       cfg.Weight,
		FailOpen:     cfg.FailOpen,
		Shadow:       cfg.Shadow,
		CheckTimeout: cfg.CheckTimeout,
		Logger:       cfg.Logger,
		// A call whose context ended gets CodeCanceled or
		// CodeDeadlineExceeded.
		ReportEnded: true,
	}, limiters)
	if err != nil {
		return nil, err
	}
	return &interceptor{core: core}, nil
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

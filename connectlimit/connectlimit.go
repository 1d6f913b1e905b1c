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
		return "method:" + call.Spec.Procedure, nil
	}
}

// KeyByHeader keys calls by the value of the request header name (e.g.
// "X-API-Key"), stored as httplimit.KeyByHeader stores it ("hdr:" and the
// value's SHA-256 in hex), so the secret itself is never written and a
// client has one bucket over plain HTTP and Connect. A call without the
// header gets ErrNoKey.
func KeyByHeader(name string) KeyFunc {
	byHeader := httplimit.KeyByHeader(name)
	return func(_ context.Context, call Call) (string, error) {
		key, err := byHeader(&http.Request{Header: call.Header})
		if err != nil {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
		}
		return key, nil
	}
}

// DefaultCheckTimeout is the bound on each check unless WithCheckTimeout
// sets another: far above a healthy check (a millisecond or a few), well
// below the deadlines of most clients.
const DefaultCheckTimeout = 2 * time.Second

// An Option configures the interceptor.
type Option func(*options)

type options struct {
	key      KeyFunc
	cost     func(ctx context.Context, call Call) int64
	failOpen bool
	shadow   bool
	logger   *slog.Logger
	timeout  time.Duration
}

// WithKeyFunc sets how a call's key is found. Defaults to
// KeyByPeer(httplimit.IPKeyConfig{}): the direct peer's address, trusting no
// proxy.
func WithKeyFunc(f KeyFunc) Option {
	return func(o *options) { o.key = f }
}

// WithCost sets how many tokens a call takes, by procedure for example.
// Defaults to 1 for every call.
func WithCost(f func(ctx context.Context, call Call) int64) Option {
	return func(o *options) { o.cost = f }
}

// WithFailOpen lets calls through, without rate-limit headers, when the
// limiter's database fails or does not answer within the check timeout.
// Without it the interceptor fails closed: connect.CodeUnavailable. Either
// way the error is logged.
func WithFailOpen() Option {
	return func(o *options) { o.failOpen = true }
}

// WithShadow checks every call but denies none: would-be denials are logged
// (Warn) and counted with pgratelimit.shadow=true, and every call goes on to
// its handler without rate-limit headers, whatever the check says (also
// when it fails or the call has no key, logged too). Use it to roll a new
// limit out: shadow first, read the would-be denials, then enforce.
func WithShadow() Option {
	return func(o *options) { o.shadow = true }
}

// WithLogger sets the logger of database errors and, in shadow mode, of
// would-be denials. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithCheckTimeout bounds each check, from taking a database connection to
// the answer: a check that takes longer fails closed
// (connect.CodeUnavailable) or open (WithFailOpen), so a database that
// accepts connections and never answers cannot hold calls. The call's own
// deadline still applies when it is sooner. Defaults to DefaultCheckTimeout;
// zero keeps the default and a negative d sets no bound but the call's
// context.
func WithCheckTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// NewInterceptor returns an interceptor that checks every call a handler
// receives against l, unary calls and streams alike (streams once, when they
// open), before it reaches the handler; on clients it does nothing. Give it
// to a handler with connect.WithInterceptors. See the package doc for keys,
// answers, failures and shadow mode.
func NewInterceptor(l *pgratelimit.Limiter, opts ...Option) connect.Interceptor {
	in := &interceptor{l: l}
	for _, o := range opts {
		o(&in.options)
	}
	if in.key == nil {
		in.key = KeyByPeer(httplimit.IPKeyConfig{})
	}
	if in.logger == nil {
		in.logger = slog.Default()
	}
	if in.timeout == 0 {
		in.timeout = DefaultCheckTimeout
	}
	return in
}

type interceptor struct {
	l *pgratelimit.Limiter
	options
}

// WrapUnary checks a unary call before its handler; the fields of an
// allowed call are set on its response's headers, or on the handler's
// error's Meta when it returns a *connect.Error.
func (in *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		fields, err := in.check(ctx, Call{Spec: req.Spec(), Peer: req.Peer(), Header: req.Header()})
		if err != nil {
			return nil, err
		}
		res, err := next(ctx, req)
		var ce *connect.Error
		switch {
		case fields == nil:
		case err == nil && res != nil:
			setFields(res.Header(), fields)
		case errors.As(err, &ce):
			setFields(ce.Meta(), fields)
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
		fields, err := in.check(ctx, Call{Spec: conn.Spec(), Peer: conn.Peer(), Header: conn.RequestHeader()})
		if err != nil {
			return err
		}
		if fields != nil {
			setFields(conn.ResponseHeader(), fields)
		}
		return next(ctx, conn)
	}
}

func setFields(h http.Header, f *httplimit.Fields) {
	h.Set("RateLimit-Policy", f.Policy)
	h.Set("RateLimit", f.RateLimit)
	if f.RetryAfter != "" {
		h.Set("Retry-After", f.RetryAfter)
	}
}

// check checks a call. It returns the fields to send with an allowed call
// (nil for none), or the error that ends the call.
func (in *interceptor) check(ctx context.Context, call Call) (*httplimit.Fields, error) {
	proc := call.Spec.Procedure
	key, err := in.key(ctx, call)
	if err != nil {
		return nil, in.refuse(ctx, proc, err)
	}
	cost := int64(1)
	if in.cost != nil {
		cost = in.cost(ctx, call)
	}
	cctx := ctx
	if in.timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, in.timeout)
		defer cancel()
	}
	if in.shadow {
		cctx = pgratelimit.WithShadow(cctx)
	}
	res, err := pgratelimit.AllowAll(cctx, pgratelimit.Charge{Limiter: in.l, Key: key, Cost: cost})
	switch {
	case err != nil && isInputError(err):
		return nil, in.refuse(ctx, proc, err)
	case err != nil && ctx.Err() != nil:
		// The call's own context ended: answering it is moot.
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, ctx.Err())
	case err != nil:
		open := in.failOpen || in.shadow
		in.logger.ErrorContext(ctx, "connectlimit: rate-limit check failed", "procedure", proc, "error", err, "fail_open", open)
		if open {
			return nil, nil
		}
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("connectlimit: rate limiter unavailable"))
	case in.shadow:
		if !res.Allowed {
			in.logger.WarnContext(ctx, "connectlimit: shadow: would deny", "procedure", proc,
				"key", key, "prefix", in.l.Config().Prefix, "retry_after", res.RetryAfter)
		}
		return nil, nil
	}
	f := httplimit.FieldsFor([]*pgratelimit.Limiter{in.l}, res)
	if res.Allowed {
		return &f, nil
	}
	ce := connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("connectlimit: rate limit %q exceeded, retry after %s", in.l.Config().Prefix, res.RetryAfter))
	setFields(ce.Meta(), &f)
	if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)}); err == nil {
		ce.AddDetail(d)
	}
	return nil, ce
}

// refuse answers a call that could not be checked for its own fault (no key,
// an invalid key or cost): connect.CodeInvalidArgument, or on to the handler
// in shadow mode.
func (in *interceptor) refuse(ctx context.Context, procedure string, err error) error {
	if in.shadow {
		in.logger.WarnContext(ctx, "connectlimit: shadow: call not checked", "procedure", procedure, "error", err)
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, err)
}

func isInputError(err error) bool {
	return errors.Is(err, pgratelimit.ErrInvalidKey) || errors.Is(err, pgratelimit.ErrInvalidCost) ||
		errors.Is(err, pgratelimit.ErrCostExceedsCapacity)
}

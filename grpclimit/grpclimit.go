// Package grpclimit rate-limits gRPC servers with pgratelimit limiters:
// unary and streaming server interceptors (NewInterceptor's Unary and
// Stream), and an adapter for the chain of go-grpc-middleware v2 (its
// interceptors/ratelimit package).
//
// NewInterceptor(cfg, limiters...) builds them; Config's zero value checks
// every call against the limiters given, keyed by the peer's address.
// httplimit and connectlimit take a Config with the same fields, and answer
// alike.
//
// It is a module of its own, so that services importing only the library
// never download gRPC.
//
// # Calls and keys
//
// Each call is one check of the limiters, all at once (a stream is checked
// once, when it opens; its messages are not counted), of the call's key and
// cost; Config.Limiters picks the limiters per call (a plan). The key is the
// peer's IP address by default (KeyByPeer with no trusted proxy, in
// httplimit's format "ip:ADDRESS", so a client shares its bucket with its
// HTTP requests), or the method (KeyByMethod), an API key from the metadata
// (KeyByMetadata, hashed), or any KeyFunc of the context and the method. The
// cost is 1 unless Config.Cost says otherwise.
//
// # Answers
//
// An allowed call goes on to the handler with the rate-limit fields of the
// IETF draft that httplimit sends, as response header metadata (keys in
// lower case, values as httplimit computes them):
//
//	ratelimit-policy: "api";q=10;w=10
//	ratelimit: "api";r=7;t=3
//
// A denied call ends with codes.ResourceExhausted, a google.rpc.RetryInfo
// detail (errdetails.RetryInfo) whose RetryDelay is the exact wait
// (Result.RetryAfter), and the same header metadata plus "retry-after" in
// whole seconds, rounded up. A call without a key, whose Config.Limiters
// fails, or with an invalid key or cost, ends with codes.InvalidArgument.
//
// # Exemptions
//
// Config.Exempt lets calls through unchecked: a call it says is exempt is not
// keyed, costs nothing, never reaches the limiter and gets no rate-limit
// metadata, in shadow mode too. ExemptMethods exempts methods or whole
// services by name, such as health checks and reflection:
//
//	grpclimit.Config{Exempt: grpclimit.ExemptMethods("grpc.health.v1.Health",
//		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")}
//
// # Concurrency
//
// Config.Semaphore makes each call, or each stream for as long as it is open,
// hold a lease of a pgratelimit.Semaphore for its key while its handler
// runs: "at most 5 calls in flight per client". The lease is taken with the
// limiters' tokens, all or nothing, extended every TTL/3 and released when
// the handler returns (also when it panics). A call that finds no free
// units ends with codes.ResourceExhausted and the same fields; exempt
// calls take no lease.
//
// # Failures and timeouts
//
// When the database fails, the interceptors fail closed with
// codes.Unavailable by default, or open (the call goes on, without
// rate-limit metadata) with Config.FailOpen; either way the error is
// logged. Each check is bounded by Config.CheckTimeout (DefaultCheckTimeout
// unless set), so a database that accepts connections and never answers costs a
// call at most that long. A call whose own context ends during the check
// ends with that context's status (codes.Canceled or
// codes.DeadlineExceeded).
//
// # Shadow mode
//
// Config.Shadow rolls a limit out without enforcing it: every call is checked
// (an allowed check takes its tokens, a would-be denial writes nothing),
// would-be denials are logged at Warn with the key, the limiter's prefix and
// the retry delay, and counted with pgratelimit.shadow=true (see
// pgratelimit.WithShadow); every call goes on to its handler, without
// rate-limit metadata, also when the check fails or the call has no key.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// KeyFunc returns the rate-limit key of a call to fullMethod
// ("/package.Service/Method"), reading what it needs from ctx
// (peer.FromContext, metadata.FromIncomingContext). An error ends the call
// with codes.InvalidArgument (in shadow mode, the call goes on). Keys are
// stored in plain text: hash anything secret.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// ErrNoKey is returned by the key functions when a call carries nothing to
// key it by (no peer address, no such metadata).
var ErrNoKey = errors.New("grpclimit: no rate-limit key in call")

// IPKeyConfig configures KeyByPeer, as httplimit.IPKeyConfig configures
// httplimit.KeyByIP: a client has the same key over HTTP and gRPC.
type IPKeyConfig struct {
	// TrustedProxies are the networks of your own proxies and load
	// balancers. The x-forwarded-for metadata is believed only when the
	// peer is in one of them, and then read from the right, skipping
	// trusted hops: the first untrusted address is the client. Defaults to
	// none: the peer is the client.
	TrustedProxies []netip.Prefix

	// IPv6Prefix, when in 1..127, keys IPv6 clients by their network of
	// this many bits (64 groups a /64) instead of by address. Defaults to
	// 0: the whole address.
	IPv6Prefix int
}

// KeyByPeer keys calls by the client's IP address as httplimit.KeyByIP
// does, from the peer's address (peer.FromContext) and, when the peer is
// one of cfg.TrustedProxies, the x-forwarded-for metadata: "ip:ADDRESS", or
// "ip:NETWORK/BITS" with cfg.IPv6Prefix. A peer that is not an IP address
// (a Unix socket) gets ErrNoKey.
func KeyByPeer(cfg IPKeyConfig) KeyFunc {
	c := middleware.IPKeyConfig(cfg)
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: no peer", ErrNoKey)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		key, err := c.Key(p.Addr.String(), md.Get("x-forwarded-for"))
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
		}
		return key, nil
	}
}

// KeyByMethod keys calls by method alone, as "method:/package.Service/Method":
// one bucket per method, shared by every client (a global limit).
// connectlimit.KeyByProcedure makes the same keys.
func KeyByMethod() KeyFunc {
	return func(_ context.Context, fullMethod string) (string, error) {
		return middleware.MethodKey(fullMethod), nil
	}
}

// KeyByMetadata keys calls by the first value of the metadata key name
// (e.g. "x-api-key"), stored as "hdr:" and the value's SHA-256 in hex, as
// httplimit.KeyByHeader stores a header's, so the secret itself is never
// written and a client has one bucket over HTTP and gRPC. A call without it
// gets ErrNoKey.
func KeyByMetadata(name string) KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		vs := md.Get(name)
		if len(vs) == 0 || vs[0] == "" {
			return "", fmt.Errorf("%w: metadata %s is missing", ErrNoKey, name)
		}
		return middleware.SecretKey(vs[0]), nil
	}
}

// DefaultCheckTimeout is the bound on each check when Config.CheckTimeout
// is zero: far above a healthy check (a millisecond or a few), well below
// the deadlines of most clients.
const DefaultCheckTimeout = middleware.DefaultCheckTimeout

// Config configures NewInterceptor and MiddlewareLimiter. Its zero value
// checks every call against the limiters given, keyed by the peer's
// address. The funcs are called with the call's context and full method
// ("/package.Service/Method").
type Config struct {
	// KeyFunc picks the bucket of a call. Defaults to
	// KeyByPeer(IPKeyConfig{}): the direct peer's address, trusting no
	// proxy.
	KeyFunc KeyFunc

	// Limiters, when set, picks the limiters a call is checked against,
	// given its key (e.g. a plan looked up from the API key), all charged
	// at once, in place of those given to NewInterceptor. An error ends
	// the call with codes.InvalidArgument, as a KeyFunc error does.
	// Defaults to nil: the limiters given.
	Limiters func(ctx context.Context, fullMethod, key string) ([]*pgratelimit.Limiter, error)

	// Cost is how many tokens a call takes of each limiter, by method for
	// example. Defaults to 1 for every call.
	Cost func(ctx context.Context, fullMethod string) int64

	// Exempt, when it returns true, lets a call through unchecked: no key,
	// no check, no rate-limit metadata, whatever the other fields say, in
	// shadow mode too. ExemptMethods makes one for health checks and
	// reflection. Defaults to nil: every call is checked.
	Exempt func(ctx context.Context, fullMethod string) bool

	// Semaphore, when set, makes each call (each stream, for as long as it
	// is open) hold a lease of its key (the limiters' key) while its
	// handler runs: taken in the same pgratelimit.AllowAll as the
	// limiters' tokens (all or nothing), extended every TTL/3, released
	// when the handler returns, also when it panics. A call that finds no
	// free units is denied as the limiters deny one
	// (codes.ResourceExhausted, with the rate-limit metadata: the
	// semaphore's policy is "name";q=Max and RateLimit reports it as
	// "name";r=free). It must use the limiters' pool. MiddlewareLimiter
	// refuses it: its chain cannot hold a lease. Defaults to nil: no lease.
	Semaphore *pgratelimit.Semaphore

	// Weight is how many units of the Semaphore a call's lease holds; set
	// without a Semaphore, it is an invalid Config. Defaults to 1 for
	// every call.
	Weight func(ctx context.Context, fullMethod string) int64

	// FailOpen lets calls through, without rate-limit metadata, when the
	// limiter's database fails or does not answer within the check
	// timeout. Defaults to false: fail closed with codes.Unavailable.
	// Either way the error is logged.
	FailOpen bool

	// Shadow checks every call but denies none: would-be denials are
	// logged (Warn) and counted with pgratelimit.shadow=true, and every
	// call goes on to its handler without rate-limit metadata, whatever the
	// check says (also when it fails or the call has no key, logged too).
	// Use it to roll a new limit out: shadow first, read the would-be
	// denials, then enforce. Defaults to false: enforce.
	Shadow bool

	// CheckTimeout bounds each check, from taking a database connection to
	// the answer: a check that takes longer fails closed
	// (codes.Unavailable) or open (FailOpen), so a database that accepts
	// connections and never answers cannot hold calls. The call's own
	// deadline still applies when it is sooner. A negative value sets no
	// bound but the call's context. Defaults to DefaultCheckTimeout.
	CheckTimeout time.Duration

	// Logger receives database errors and, in shadow mode, the would-be
	// denials. Defaults to slog.Default().
	Logger *slog.Logger
}

// ExemptMethods returns a Config.Exempt that exempts the calls of names:
// methods ("/package.Service/Method", the leading slash optional) or whole
// services ("package.Service", each of its methods). For the standard
// health and reflection services:
//
//	grpclimit.ExemptMethods("grpc.health.v1.Health",
//		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
func ExemptMethods(names ...string) func(ctx context.Context, fullMethod string) bool {
	match := middleware.MatchMethods(names...)
	return func(_ context.Context, fullMethod string) bool { return match(fullMethod) }
}

// core is the middleware core of cfg and limiters, for calls named by
// their full method.
func (cfg Config) core(limiters []*pgratelimit.Limiter) (*middleware.Core[string], error) {
	if cfg.KeyFunc == nil {
		cfg.KeyFunc = KeyByPeer(IPKeyConfig{})
	}
	return middleware.New(middleware.Config[string]{
		Name:         "grpclimit",
		Noun:         "call",
		Attrs:        func(fullMethod string) []any { return []any{"method", fullMethod} },
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
		// A call whose context ended gets that context's status.
		ReportEnded: true,
	}, limiters)
}

// Interceptor checks the calls of a gRPC server: give its Unary and Stream
// to grpc.ChainUnaryInterceptor and grpc.ChainStreamInterceptor. Make it
// with NewInterceptor. It is safe for concurrent use.
type Interceptor struct {
	core *middleware.Core[string]
}

// NewInterceptor returns an Interceptor that checks every call against
// limiters, all at once, in one pgratelimit.AllowAll, before it reaches its
// handler (a stream once, when it opens). Config.Limiters, when set, picks
// the limiters per call instead; with Config.Semaphore there may be none
// (concurrency alone). Every limiter must use the same pool. See the
// package doc for keys, answers, failures and shadow mode.
//
// A Config that cannot check anything (no limiter, no Config.Limiters, no
// Config.Semaphore), a nil limiter, or a Weight without a Semaphore is an
// error wrapping pgratelimit.ErrInvalidConfig: nothing is refused later,
// at call time, for the Config's sake.
func NewInterceptor(cfg Config, limiters ...*pgratelimit.Limiter) (*Interceptor, error) {
	core, err := cfg.core(limiters)
	if err != nil {
		return nil, err
	}
	return &Interceptor{core: core}, nil
}

// check checks a call to fullMethod. It returns the header metadata to send
// (nil for none), the func to call when the call has ended (never nil) and,
// when the call must not go on, its status error.
func (in *Interceptor) check(ctx context.Context, fullMethod string) (metadata.MD, func(), error) {
	d, release := in.core.Check(ctx, fullMethod)
	md, err := answer(d)
	return md, release, err
}

// answer is the header metadata and the status error of decision d.
func answer(d middleware.Decision) (metadata.MD, error) {
	switch d.Verdict {
	case middleware.Exempt, middleware.Pass:
		return nil, nil
	case middleware.Allow:
		return metadata.Pairs(d.Fields.Pairs()...), nil
	case middleware.Deny:
		st := status.New(codes.ResourceExhausted, fmt.Sprintf("grpclimit: rate limit %q exceeded, retry after %s", d.Prefix(), d.Result.RetryAfter))
		if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.Result.RetryAfter)}); err == nil {
			st = withInfo
		}
		return metadata.Pairs(d.Fields.Pairs()...), st.Err()
	case middleware.Invalid:
		return nil, status.Error(codes.InvalidArgument, d.Err.Error())
	case middleware.Ended:
		return nil, status.FromContextError(d.Err).Err()
	default: // Unavailable
		return nil, status.Error(codes.Unavailable, "grpclimit: rate limiter unavailable")
	}
}

// Unary is a grpc.UnaryServerInterceptor: it checks a call before its
// handler, and holds its lease (Config.Semaphore) while the handler runs.
func (in *Interceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, release, err := in.check(ctx, info.FullMethod)
	defer release()
	if md != nil {
		// Fails only outside a server's call (no stream in ctx), when
		// there is no one to send it to.
		_ = grpc.SetHeader(ctx, md)
	}
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor: it checks a stream when it
// opens, before its handler, and holds its lease (Config.Semaphore) for as
// long as the stream is open; the stream's messages are not checked.
func (in *Interceptor) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	md, release, err := in.check(ss.Context(), info.FullMethod)
	defer release()
	if md != nil {
		_ = ss.SetHeader(md)
	}
	if err != nil {
		return err
	}
	return handler(srv, ss)
}

// MiddlewareLimiter returns the Limiter of go-grpc-middleware v2's
// interceptors/ratelimit for cfg and limiters, for teams that build their
// chain from it:
//
//	grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(limiter))
//
// Its Limit checks a call as an Interceptor does, finding the method with
// grpc.Method, and sends the same header metadata. The chain turns every
// error Limit returns into codes.ResourceExhausted with a message of its
// own that quotes ours ("retry after 3s"): the RetryInfo detail is lost,
// and so is the difference between a denial and a database failure (fail
// closed) or a call without a key. Prefer NewInterceptor where that
// matters. For server interceptors only: a client's context has no peer
// and no server stream.
//
// The chain cannot hold anything for a call's duration: a Config with a
// Semaphore is refused (pgratelimit.ErrInvalidConfig), as NewInterceptor
// refuses the Configs it refuses.
func MiddlewareLimiter(cfg Config, limiters ...*pgratelimit.Limiter) (ratelimit.Limiter, error) {
	if cfg.Semaphore != nil {
		return nil, fmt.Errorf("%w: grpclimit: MiddlewareLimiter cannot hold a lease for a call: Config.Semaphore needs NewInterceptor", pgratelimit.ErrInvalidConfig)
	}
	in, err := NewInterceptor(cfg, limiters...)
	if err != nil {
		return nil, err
	}
	return middlewareLimiter{in}, nil
}

type middlewareLimiter struct{ in *Interceptor }

// Limit checks the call of ctx; a non-nil error denies it.
func (m middlewareLimiter) Limit(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	md, release, err := m.in.check(ctx, method)
	// No lease was taken (no Semaphore): there is nothing to hold.
	release()
	if md != nil {
		_ = grpc.SetHeader(ctx, md)
	}
	return err
}

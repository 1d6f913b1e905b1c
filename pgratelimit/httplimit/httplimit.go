// Package httplimit is net/http middleware that rate-limits requests with a
// pgratelimit.Limiter and tells clients their limits in standard headers.
//
// # Headers
//
// Every limited response carries the fields of the IETF httpapi draft
// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-11):
//
//	RateLimit-Policy: "api";q=10;w=10
//	RateLimit: "api";r=7;t=3
//
// A token bucket maps onto the draft's quota policy like this: the quota q is
// the bucket's Capacity; the window w is how long an empty bucket takes to
// fill, ceil(Capacity/Refill) intervals, in seconds rounded up; r is the
// tokens remaining after this request; t is the seconds until the bucket is
// full again (Result.ResetAfter, rounded up). Quota units are tokens: one per
// request unless Options.Cost says otherwise. The policy's name is the
// limiter's Config.Prefix. Numbers above 15 digits, which RFC 8941 does not
// allow, are sent as MaxSFInteger.
//
// With several limiters (MiddlewareAll), RateLimit-Policy lists every policy
// and RateLimit reports one: the policy that denied the request (the one with
// the longest wait), or, when allowed, the one with the smallest share of its
// quota left. One item, because it is the limit that matters to a client
// deciding when to send next, and clients that read only the first item of
// the field then read the right one; the policies' names tell them apart.
//
// A denied request gets 429 Too Many Requests with Retry-After in whole
// seconds, rounded up, so a client that obeys it is never early. With
// Options.LegacyHeaders the widespread X-RateLimit-Limit, -Remaining and
// -Reset (seconds) are sent as well.
//
// # Keys
//
// KeyByIP keys by client address, believing X-Forwarded-For only from
// trusted proxies; KeyByHeader keys by a request header such as an API key.
// Keys are stored in plain text in the bucket table: KeyByHeader hashes the
// header value, and a custom KeyFunc should hash anything secret too.
//
// # Exemptions
//
// Options.Exempt lets requests through unchecked: a request it says is
// exempt is not keyed, costs nothing, never reaches the limiter and gets no
// rate-limit headers, in shadow mode too. ExemptPaths exempts exact paths:
//
//	httplimit.Options{Exempt: httplimit.ExemptPaths("/healthz", "/readyz")}
//
// # Concurrency
//
// Options.Semaphore makes each request hold a lease of its key (the same key
// as the limiters') for as long as its handler runs: "at most 5 requests in
// flight per client". The lease is taken in the same pgratelimit.AllowAll
// as the limiters' tokens (all or nothing), extended every TTL/3 while the
// handler runs, and released when it returns, also when it panics. A
// request that finds no free units gets the 429 of a denied one, with
// Retry-After; RateLimit-Policy lists the semaphore as "name";q=Max, and
// RateLimit reports it, when it is the limit that matters, as "name";r=free.
// Middleware(nil, opts) with a Semaphore limits concurrency alone.
//
// # Failures and timeouts
//
// When the database fails, the middleware fails closed (503) by default, or
// open (the request goes through, without rate-limit headers) with
// Options.FailOpen; either way the error is logged. Each check is bounded by
// Options.CheckTimeout (DefaultCheckTimeout unless set), so a database that
// accepts connections and never answers costs a request at most that long
// before it fails closed or open: the bound covers taking a connection from
// the pool, connecting, and the check's statements.
//
// # Shadow mode
//
// With Options.Shadow a limit is rolled out without being enforced: every
// request is checked as it would be (an allowed check takes its tokens, a
// would-be denial writes nothing), each would-be denial is logged at Warn
// with the key, the limiter's prefix and the retry delay, the checks are
// counted in pgratelimit.checks with pgratelimit.shadow=true (see
// pgratelimit.WithShadow), and every request goes on to the next handler,
// without rate-limit headers: clients see nothing of a shadowed limit, not
// even when the database fails or a request has no key. Read the counts,
// then enforce (docs/shadow-mode.md in the repository has the queries).
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// KeyFunc returns the rate-limit key of a request, or an error when the
// request has none (the middleware then answers via Options.ErrorHandler).
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is returned by the key functions when a request carries nothing
// to key it by (no such header, an unparsable address).
var ErrNoKey = errors.New("httplimit: no rate-limit key in request")

// Options configure Middleware.
type Options struct {
	// KeyFunc picks the bucket of a request. Defaults to KeyByIP(IPKeyConfig{}):
	// the direct peer's address, trusting no proxy.
	KeyFunc KeyFunc

	// Exempt, when it returns true, lets a request through unchecked: no
	// key, no check, no rate-limit headers, whatever the other options say
	// (health checks, metrics). ExemptPaths makes one. Defaults to nil:
	// every request is checked.
	Exempt func(r *http.Request) bool

	// Cost is how many tokens a request takes. Defaults to 1 for every
	// request.
	Cost func(r *http.Request) int64

	// FailOpen lets requests through, without rate-limit headers, when the
	// limiter's database fails. Defaults to false: fail closed with 503
	// Service Unavailable. Either way the error is logged.
	FailOpen bool

	// DeniedHandler answers a denied request, after the headers (including
	// Retry-After) are set. Defaults to a 429 Too Many Requests with a short
	// text body.
	DeniedHandler http.Handler

	// ErrorHandler answers a request that could not be checked: no key
	// (KeyFunc's error), an invalid key or cost (pgratelimit's input errors),
	// or, when failing closed, a database error. Defaults to 400 Bad Request
	// for the request's own faults and 503 Service Unavailable for the
	// database's.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

	// LegacyHeaders also sends X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until full). Defaults to false.
	LegacyHeaders bool

	// Logger receives database errors and, in shadow mode, the would-be
	// denials. Defaults to slog.Default().
	Logger *slog.Logger

	// Shadow checks every request but denies none: would-be denials are
	// logged (Warn) and counted with pgratelimit.shadow=true, and every
	// request goes through without rate-limit headers, whatever the check
	// says, also when it fails or the request has no key (logged too). Use
	// it to roll a new limit out: shadow first, read the would-be denials,
	// then enforce. Defaults to false: enforce.
	Shadow bool

	// CheckTimeout bounds each check, from taking a database connection to
	// the answer: a check that takes longer fails with
	// context.DeadlineExceeded and the request fails closed (503) or open
	// (Options.FailOpen), so a database that accepts connections and never
	// answers cannot hold requests. The request's own context still applies
	// when it ends sooner. Defaults to DefaultCheckTimeout; a negative value
	// sets no bound but the request's context.
	CheckTimeout time.Duration

	// Limiters, when set, picks the limiters a request is checked against,
	// given its key (e.g. a plan looked up from the API key: free or pro),
	// overriding those given to MiddlewareAll or Middleware. An error is
	// answered by ErrorHandler. Defaults to nil: the limiters given.
	Limiters func(r *http.Request, key string) ([]*pgratelimit.Limiter, error)

	// Semaphore, when set, makes each request hold a lease of its key for
	// as long as its handler runs (see Concurrency in the package doc): a
	// request that finds no free units is denied (429). It must use the
	// limiters' pool. Defaults to nil: no lease.
	Semaphore *pgratelimit.Semaphore

	// Weight is how many units of the Semaphore a request's lease holds.
	// Defaults to 1 for every request.
	Weight func(r *http.Request) int64
}

// DefaultCheckTimeout is the bound on each check when Options.CheckTimeout
// is zero: far above a healthy check (a millisecond or a few), well below
// the timeouts of clients and load balancers.
const DefaultCheckTimeout = middleware.DefaultCheckTimeout

// Middleware returns middleware that checks every request against l before
// passing it on. See the package doc for headers, keys and failures. l may
// be nil when Options.Semaphore is set: the middleware then limits
// concurrency alone.
func Middleware(l *pgratelimit.Limiter, opts Options) func(http.Handler) http.Handler {
	if l == nil {
		return MiddlewareAll(nil, opts)
	}
	return MiddlewareAll([]*pgratelimit.Limiter{l}, opts)
}

// MiddlewareAll returns middleware that enforces every limiter of limiters on
// each request at once, in one pgratelimit.AllowAll: "10 per second and 1000
// per day" take their tokens together or not at all, so a request denied by
// the daily limit spends nothing of the per-second one. Options.Limiters, when
// set, picks the limiters per request instead (a plan looked up from the API
// key, say). Every limiter must use the same pool.
func MiddlewareAll(limiters []*pgratelimit.Limiter, opts Options) func(http.Handler) http.Handler {
	opts = opts.withDefaults(limiters)
	core := middleware.New(opts.core())
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, release := core.Check(r.Context(), r)
			defer release()
			switch d.Verdict {
			case middleware.Exempt, middleware.Pass:
				next.ServeHTTP(w, r)
			case middleware.Allow:
				setHeaders(w.Header(), d, opts.LegacyHeaders)
				next.ServeHTTP(w, r)
			case middleware.Deny:
				setHeaders(w.Header(), d, opts.LegacyHeaders)
				opts.DeniedHandler.ServeHTTP(w, r)
			default: // Invalid, Unavailable
				opts.ErrorHandler(w, r, d.Err)
			}
		})
	}
}

// withDefaults fills in opts' defaults, with limiters as the limiters of
// every request unless opts.Limiters picks them.
func (opts Options) withDefaults(limiters []*pgratelimit.Limiter) Options {
	if opts.KeyFunc == nil {
		opts.KeyFunc = KeyByIP(IPKeyConfig{})
	}
	if opts.DeniedHandler == nil {
		opts.DeniedHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "429 too many requests: retry after "+w.Header().Get("Retry-After")+"s", http.StatusTooManyRequests)
		})
	}
	if opts.ErrorHandler == nil {
		opts.ErrorHandler = defaultErrorHandler
	}
	if opts.Limiters == nil {
		opts.Limiters = func(*http.Request, string) ([]*pgratelimit.Limiter, error) { return limiters, nil }
	}
	return opts
}

// core is the configuration of the middleware's core: a request whose
// context ends during a failed check is a failure like any other (logged,
// then 503 or on).
func (opts Options) core() middleware.Config[*http.Request] {
	cfg := middleware.Config[*http.Request]{
		Name: "httplimit",
		Noun: "request",
		Key:  func(_ context.Context, r *http.Request) (string, error) { return opts.KeyFunc(r) },
		Limiters: func(_ context.Context, r *http.Request, key string) ([]*pgratelimit.Limiter, error) {
			return opts.Limiters(r, key)
		},
		FailOpen:     opts.FailOpen,
		Shadow:       opts.Shadow,
		CheckTimeout: opts.CheckTimeout,
		Logger:       opts.Logger,
		Semaphore:    opts.Semaphore,
	}
	if opts.Weight != nil {
		cfg.Weight = func(_ context.Context, r *http.Request) int64 { return opts.Weight(r) }
	}
	if opts.Exempt != nil {
		cfg.Exempt = func(_ context.Context, r *http.Request) bool { return opts.Exempt(r) }
	}
	if opts.Cost != nil {
		cfg.Cost = func(_ context.Context, r *http.Request) int64 { return opts.Cost(r) }
	}
	return cfg
}

// setHeaders sets the rate-limit fields of the answer d (Allow or Deny),
// including Retry-After when it was denied, and the legacy ones if asked.
func setHeaders(h http.Header, d middleware.Decision, legacy bool) {
	d.Fields.Set(h)
	if legacy {
		top := d.Result.Results[d.Reported()]
		h.Set("X-RateLimit-Limit", strconv.FormatInt(top.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(top.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(middleware.CeilSeconds(top.ResetAfter), 10))
	}
}

// Fields are the rate-limit fields of the answer to a check, as Middleware
// sends them (see the package doc). They are exported for adapters of other
// protocols, so that every transport reports a limit alike (the gRPC and
// Connect interceptors of this repository send the same fields as response
// metadata).
type Fields struct {
	// Policy is the value of RateLimit-Policy: every limiter's policy, in
	// the order given.
	Policy string
	// RateLimit is the value of RateLimit: the policy that denied the check
	// (the longest wait) or, when allowed, the one with the smallest share
	// of its quota left.
	RateLimit string
	// RetryAfter is the value of Retry-After for a denied check: whole
	// seconds, rounded up, at least 1. Empty when the check was allowed.
	RetryAfter string
}

// FieldsFor returns the fields of the answer to a check of limiters (in the
// order charged, as given to pgratelimit.AllowAll) that gave res.
func FieldsFor(limiters []*pgratelimit.Limiter, res pgratelimit.MultiResult) Fields {
	return Fields(middleware.FieldsFor(limiters, res))
}

// MaxSFInteger is the largest integer a Structured Field (RFC 8941) can carry:
// 15 digits. Larger numbers in RateLimit-Policy and RateLimit are sent as
// this, so that strict parsers accept the fields.
const MaxSFInteger = middleware.MaxSFInteger

func defaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrNoKey) || middleware.IsInputError(err) {
		http.Error(w, "400 bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	http.Error(w, "503 service unavailable: rate limiter unavailable", http.StatusServiceUnavailable)
}

// ExemptPaths returns an Options.Exempt that exempts the requests whose URL
// path is exactly one of paths, such as "/healthz". The match is exact so
// that no other route can be reached through an exempt path ("/healthz/../x"
// is checked); exempt a subtree with a func of your own.
func ExemptPaths(paths ...string) func(r *http.Request) bool {
	exempt := make(map[string]bool, len(paths))
	for _, p := range paths {
		exempt[p] = true
	}
	return func(r *http.Request) bool { return exempt[r.URL.Path] }
}

// IPKeyConfig configures KeyByIP.
type IPKeyConfig struct {
	// TrustedProxies are the networks of your own proxies and load
	// balancers. X-Forwarded-For is believed only when the direct peer is in
	// one of them, and then read from the right, skipping trusted hops: the
	// first untrusted address is the client. A client cannot spoof its way
	// past this, since only what your proxies appended is read. Defaults to
	// none: the direct peer is the client.
	TrustedProxies []netip.Prefix

	// IPv6Prefix, when > 0, keys IPv6 clients by their network of this many
	// bits (64 groups a /64, which one subscriber typically holds) instead of
	// by address. Defaults to 0: the whole address.
	IPv6Prefix int
}

// KeyByIP keys requests by client IP address, as "ip:ADDRESS" (or
// "ip:NETWORK/BITS" with IPv6Prefix).
func KeyByIP(cfg IPKeyConfig) KeyFunc {
	return func(r *http.Request) (string, error) {
		return cfg.Key(r.RemoteAddr, r.Header.Values("X-Forwarded-For"))
	}
}

// Key returns the key KeyByIP gives a request whose direct peer is peer
// ("ip", "ip:port" or "[ipv6]:port") and whose X-Forwarded-For fields, in
// the order received, are forwardedFor. It is exported for adapters of other
// transports (the gRPC and Connect interceptors of this repository key by
// peer with it, reading x-forwarded-for metadata), so that a client has the
// same bucket whichever way it comes in. An unparsable peer is ErrNoKey.
func (c IPKeyConfig) Key(peer string, forwardedFor []string) (string, error) {
	ip, err := clientAddr(peer, forwardedFor, c.TrustedProxies)
	if err != nil {
		return "", err
	}
	if ip.Is6() && c.IPv6Prefix > 0 && c.IPv6Prefix < 128 {
		p, err := ip.Prefix(c.IPv6Prefix)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
		}
		return "ip:" + p.String(), nil
	}
	return "ip:" + ip.String(), nil
}

// ClientIP returns the address of the client that sent r: the direct peer,
// or, when the peer is a trusted proxy, the rightmost address in
// X-Forwarded-For that is not a trusted proxy. An entry that does not parse
// stops the walk at the last trusted hop, which is then taken as the client.
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	return clientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)
}

func clientAddr(remote string, forwardedFor []string, trusted []netip.Prefix) (netip.Addr, error) {
	peer, err := parseAddr(remote)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q", ErrNoKey, remote)
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	client := peer
	if !isTrusted(peer) {
		return client, nil
	}
	var hops []string
	for _, v := range forwardedFor {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := parseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return client, nil
		}
		client = a
		if !isTrusted(a) {
			return client, nil
		}
	}
	return client, nil
}

// parseAddr parses "ip", "ip:port" or "[ipv6]:port", unmapping IPv4-in-IPv6.
func parseAddr(s string) (netip.Addr, error) {
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return a.Unmap().WithZone(""), nil
}

// KeyByHeader keys requests by the value of header name (e.g. "X-API-Key"),
// stored as "hdr:" and the value's SHA-256 in hex, so the secret itself is
// never written to the database. A request without the header gets ErrNoKey.
// To inspect such a bucket with the CLI, hash the value the same way:
// printf %s "$KEY" | sha256sum.
func KeyByHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
		}
		return middleware.SecretKey(v), nil
	}
}

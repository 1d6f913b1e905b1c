// Package httplimit is net/http middleware that rate-limits requests with
// pgratelimit limiters and tells clients their limits in standard headers.
//
// Middleware(cfg, limiters...) builds it; Config's zero value checks every
// request against the limiters given, keyed by the client's address.
// grpclimit and connectlimit take a Config with the same fields, and answer
// alike.
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
// request unless Config.Cost says otherwise. The policy's name is the
// limiter's Config.Prefix. Numbers above 15 digits, which RFC 8941 does not
// allow, are sent as 999999999999999.
//
// With several limiters, RateLimit-Policy lists every policy
// and RateLimit reports one: the policy that denied the request (the one with
// the longest wait), or, when allowed, the one with the smallest share of its
// quota left. One item, because it is the limit that matters to a client
// deciding when to send next, and clients that read only the first item of
// the field then read the right one; the policies' names tell them apart.
//
// A denied request gets 429 Too Many Requests with Retry-After in whole
// seconds, rounded up, so a client that obeys it is never early. With
// Config.LegacyHeaders the widespread X-RateLimit-Limit, -Remaining and
// -Reset (seconds) are sent as well.
//
// # Keys
//
// KeyByIP keys by client address, believing X-Forwarded-For only from
// trusted proxies; KeyByHeader keys by a request header such as an API key.
// Keys are stored in plain text in the bucket table: KeyByHeader hashes the
// header value, and a custom KeyFunc should hash anything secret too. A
// request the middleware refuses (no key, an error of Config.Limiters, a
// key or cost pgratelimit refuses) is answered by Config.ErrorHandler: 400
// Bad Request by default.
//
// # Exemptions
//
// Config.Exempt lets requests through unchecked: a request it says is
// exempt is not keyed, costs nothing, never reaches the limiter and gets no
// rate-limit headers, in shadow mode too. ExemptPaths exempts exact paths:
//
//	httplimit.Config{Exempt: httplimit.ExemptPaths("/healthz", "/readyz")}
//
// # Concurrency
//
// Config.Semaphore makes each request hold a lease of its key (the same key
// as the limiters') for as long as its handler runs: "at most 5 requests in
// flight per client". The lease is taken in the same pgratelimit.AllowAll
// as the limiters' tokens (all or nothing), extended every TTL/3 while the
// handler runs, and released when it returns, also when it panics. A
// request that finds no free units gets the 429 of a denied one, with
// Retry-After; RateLimit-Policy lists the semaphore as "name";q=Max, and
// RateLimit reports it, when it is the limit that matters, as "name";r=free.
// Middleware with a Semaphore and no limiter limits concurrency alone.
//
// # Failures and timeouts
//
// When the database fails, the middleware fails closed (503) by default, or
// open (the request goes through, without rate-limit headers) with
// Config.FailOpen; either way the error is logged. Each check is bounded by
// Config.CheckTimeout (DefaultCheckTimeout unless set), so a database that
// accepts connections and never answers costs a request at most that long
// before it fails closed or open: the bound covers taking a connection from
// the pool, connecting, and the check's statements.
//
// # Shadow mode
//
// With Config.Shadow a limit is rolled out without being enforced: every
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
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// KeyFunc returns the rate-limit key of a request, or an error when the
// request has none (answered by Config.ErrorHandler: 400 by default).
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is returned by the key functions when a request carries nothing
// to key it by (no such header, an unparsable address).
var ErrNoKey = errors.New("httplimit: no rate-limit key in request")

// Config configures Middleware. Its zero value checks every request
// against the limiters given to Middleware, keyed by the peer's address.
type Config struct {
	// KeyFunc picks the bucket of a request. Defaults to
	// KeyByIP(IPKeyConfig{}): the direct peer's address, trusting no proxy.
	KeyFunc KeyFunc

	// Limiters, when set, picks the limiters a request is checked against,
	// given its key (e.g. a plan looked up from the API key: free or pro),
	// all charged at once, in place of those given to Middleware. An error
	// is the request's fault, answered as a KeyFunc error is (400 by
	// default). Defaults to nil: the limiters given to Middleware.
	Limiters func(r *http.Request, key string) ([]*pgratelimit.Limiter, error)

	// Cost is how many tokens a request takes of each limiter. Defaults to
	// 1 for every request.
	Cost func(r *http.Request) int64

	// Exempt, when it returns true, lets a request through unchecked: no
	// key, no check, no rate-limit headers, whatever the other fields say
	// (health checks, metrics). ExemptPaths makes one. Defaults to nil:
	// every request is checked.
	Exempt func(r *http.Request) bool

	// Semaphore, when set, makes each request hold a lease of its key for
	// as long as its handler runs (see Concurrency in the package doc): a
	// request that finds no free units is denied (429). It must use the
	// limiters' pool. Defaults to nil: no lease.
	Semaphore *pgratelimit.Semaphore

	// Weight is how many units of the Semaphore a request's lease holds;
	// set without a Semaphore, it is an invalid Config. Defaults to 1 for
	// every request.
	Weight func(r *http.Request) int64

	// FailOpen lets requests through, without rate-limit headers, when the
	// limiter's database fails. Defaults to false: fail closed with 503
	// Service Unavailable. Either way the error is logged.
	FailOpen bool

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
	// (FailOpen), so a database that accepts connections and never answers
	// cannot hold requests. The request's own context still applies when it
	// ends sooner. A negative value sets no bound but the request's
	// context. Defaults to DefaultCheckTimeout.
	CheckTimeout time.Duration

	// Logger receives database errors and, in shadow mode, the would-be
	// denials. Defaults to slog.Default().
	Logger *slog.Logger

	// DeniedHandler answers a denied request, after the headers (including
	// Retry-After) are set. Defaults to a 429 Too Many Requests with a short
	// text body.
	DeniedHandler http.Handler

	// ErrorHandler answers a request that could not be checked: its own
	// fault (KeyFunc's or Limiters' error, a key or cost that pgratelimit
	// refuses), or, when failing closed, the database's. err is that error.
	// Defaults to 400 Bad Request for the request's faults and 503 Service
	// Unavailable for the database's.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

	// LegacyHeaders also sends X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until full). Defaults to false.
	LegacyHeaders bool
}

// DefaultCheckTimeout is the bound on each check when Config.CheckTimeout
// is zero: far above a healthy check (a millisecond or a few), well below
// the timeouts of clients and load balancers.
const DefaultCheckTimeout = middleware.DefaultCheckTimeout

// Middleware returns middleware that checks every request against
// limiters, all at once, in one pgratelimit.AllowAll, before passing it on:
// "10 per second and 1000 per day" take their tokens together or not at
// all, so a request denied by the daily limit spends nothing of the
// per-second one. Config.Limiters, when set, picks the limiters per request
// instead; with Config.Semaphore there may be none (concurrency alone).
// Every limiter must use the same pool. See the package doc for headers,
// keys and failures.
//
// A Config that cannot check anything (no limiter, no Config.Limiters, no
// Config.Semaphore), a nil limiter, or a Weight without a Semaphore is an
// error wrapping pgratelimit.ErrInvalidConfig: nothing is refused later,
// at request time, for the Config's sake.
func Middleware(cfg Config, limiters ...*pgratelimit.Limiter) (func(http.Handler) http.Handler, error) {
	cfg = cfg.withDefaults()
	core, err := middleware.New(cfg.core(), limiters)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, release := core.Check(r.Context(), r)
			defer release()
			switch d.Verdict {
			case middleware.Exempt, middleware.Pass:
				next.ServeHTTP(w, r)
			case middleware.Allow:
				setHeaders(w.Header(), d, cfg.LegacyHeaders)
				next.ServeHTTP(w, r)
			case middleware.Deny:
				setHeaders(w.Header(), d, cfg.LegacyHeaders)
				cfg.DeniedHandler.ServeHTTP(w, r)
			case middleware.Invalid:
				cfg.ErrorHandler(w, r, invalid{d.Err})
			default: // Unavailable
				cfg.ErrorHandler(w, r, d.Err)
			}
		})
	}, nil
}

// invalid is the error of a request that could not be checked through its
// own fault: the default ErrorHandler answers it with 400.
type invalid struct{ err error }

func (e invalid) Error() string { return e.err.Error() }
func (e invalid) Unwrap() error { return e.err }

// withDefaults fills in cfg's defaults but for the core's.
func (cfg Config) withDefaults() Config {
	if cfg.KeyFunc == nil {
		cfg.KeyFunc = KeyByIP(IPKeyConfig{})
	}
	if cfg.DeniedHandler == nil {
		cfg.DeniedHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "429 too many requests: retry after "+w.Header().Get("Retry-After")+"s", http.StatusTooManyRequests)
		})
	}
	if cfg.ErrorHandler == nil {
		cfg.ErrorHandler = defaultErrorHandler
	}
	return cfg
}

// core is the configuration of the middleware's core: a request whose
// context ends during a failed check is a failure like any other (logged,
// then 503 or on).
func (cfg Config) core() middleware.Config[*http.Request] {
	c := middleware.Config[*http.Request]{
		Name:         "httplimit",
		Noun:         "request",
		Key:          func(_ context.Context, r *http.Request) (string, error) { return cfg.KeyFunc(r) },
		FailOpen:     cfg.FailOpen,
		Shadow:       cfg.Shadow,
		CheckTimeout: cfg.CheckTimeout,
		Logger:       cfg.Logger,
		Semaphore:    cfg.Semaphore,
	}
	if cfg.Limiters != nil {
		c.Limiters = func(_ context.Context, r *http.Request, key string) ([]*pgratelimit.Limiter, error) {
			return cfg.Limiters(r, key)
		}
	}
	if cfg.Weight != nil {
		c.Weight = func(_ context.Context, r *http.Request) int64 { return cfg.Weight(r) }
	}
	if cfg.Exempt != nil {
		c.Exempt = func(_ context.Context, r *http.Request) bool { return cfg.Exempt(r) }
	}
	if cfg.Cost != nil {
		c.Cost = func(_ context.Context, r *http.Request) int64 { return cfg.Cost(r) }
	}
	return c
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

func defaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.As(err, new(invalid)) {
		http.Error(w, "400 bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	http.Error(w, "503 service unavailable: rate limiter unavailable", http.StatusServiceUnavailable)
}

// ExemptPaths returns a Config.Exempt that exempts the requests whose URL
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

// IPKeyConfig configures KeyByIP. grpclimit and connectlimit have one
// alike, so that a client has the same key whichever way it comes in.
type IPKeyConfig struct {
	// TrustedProxies are the networks of your own proxies and load
	// balancers. X-Forwarded-For is believed only when the direct peer is in
	// one of them, and then read from the right, skipping trusted hops: the
	// first untrusted address is the client. A client cannot spoof its way
	// past this, since only what your proxies appended is read. Defaults to
	// none: the direct peer is the client.
	TrustedProxies []netip.Prefix

	// IPv6Prefix, when in 1..127, keys IPv6 clients by their network of
	// this many bits (64 groups a /64, which one subscriber typically
	// holds) instead of by address. Defaults to 0: the whole address.
	IPv6Prefix int
}

// KeyByIP keys requests by client IP address, as "ip:ADDRESS" (or
// "ip:NETWORK/BITS" with IPv6Prefix). A request whose peer address does not
// parse gets ErrNoKey.
func KeyByIP(cfg IPKeyConfig) KeyFunc {
	c := middleware.IPKeyConfig(cfg)
	return func(r *http.Request) (string, error) {
		k, err := c.Key(r.RemoteAddr, r.Header.Values("X-Forwarded-For"))
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
		}
		return k, nil
	}
}

// ClientIP returns the address of the client that sent r: the direct peer,
// or, when the peer is a trusted proxy, the rightmost address in
// X-Forwarded-For that is not a trusted proxy. An entry that does not parse
// stops the walk at the last trusted hop, which is then taken as the client.
// A peer address that does not parse is ErrNoKey.
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	a, err := middleware.ClientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)
	if err != nil {
		return a, fmt.Errorf("%w: %v", ErrNoKey, err)
	}
	return a, nil
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

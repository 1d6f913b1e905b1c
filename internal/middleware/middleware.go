// Package middleware is the core that the rate-limiting middleware of this
// repository shares: httplimit (net/http), grpclimit (grpc-go) and
// connectlimit (connect-go) each turn a request into a Check of a Core, and
// the Decision into their protocol's answer. Everything else is here, once:
// whether a request is exempt, its key, limiters and cost, the check bounded
// by a timeout, shadow mode, failing open or closed, the logs, and the
// rate-limit fields of the answer (RateLimit-Policy, RateLimit,
// Retry-After).
//
// # A request's path
//
//	Exempt? -> Key -> Limiters -> Cost -> pgratelimit.AllowAll -> Decision
//
// An exempt request is not checked at all. A request that has no key, whose
// limiters cannot be found, or whose key or cost pgratelimit refuses is
// Invalid. A check that fails is Unavailable (failing closed) or Pass
// (failing open); one whose request's context ended first is Ended, when the
// adapter asks for it. Otherwise the check's answer is Allow or Deny, with
// the fields to send, or Pass in shadow mode.
//
// # Holding for the request's duration
//
// Check returns, with the Decision, a release func that the adapter calls
// when the request has ended, also when its handler panics (it defers it). A
// step that holds something for as long as the request runs takes it in
// Check and gives it back in release: with Config.Semaphore, a lease of the
// request's key, taken in the same AllowAll as the limiters' tokens,
// extended every TTL/3 while the request runs, and released by release.
package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// DefaultCheckTimeout is the bound on each check when Config.CheckTimeout is
// zero: far above a healthy check (a millisecond or a few), well below the
// timeouts of clients and load balancers.
const DefaultCheckTimeout = 2 * time.Second

// Config configures a Core that checks requests of type R: what an adapter
// knows of a request (an *http.Request, a gRPC method name, a Connect call).
// The funcs are called with the request's context.
type Config[R any] struct {
	// Name begins every log message, as in "httplimit: rate-limit check
	// failed". Required.
	Name string

	// Noun is what the log messages call a request ("request", "call").
	// Required.
	Noun string

	// Attrs returns the log attributes that name a request (such as
	// "method", "/package.Service/Method"), logged before the others.
	// Defaults to none.
	Attrs func(r R) []any

	// Exempt reports whether a request is exempt: not checked at all, and
	// answered without rate-limit fields. Defaults to none exempt.
	Exempt func(ctx context.Context, r R) bool

	// Key returns a request's rate-limit key; an error makes it Invalid.
	// Required.
	Key func(ctx context.Context, r R) (string, error)

	// Limiters returns the limiters to check a request against, given its
	// key, all charged at once (one pgratelimit.AllowAll); an error makes
	// it Invalid. Defaults to the limiters given to New.
	Limiters func(ctx context.Context, r R, key string) ([]*pgratelimit.Limiter, error)

	// Cost returns the tokens a request takes. Defaults to 1.
	Cost func(ctx context.Context, r R) int64

	// Semaphore, when set, makes every request that is checked hold a
	// lease of its key (the limiters' key) for as long as it runs: taken
	// in the same AllowAll as the limiters' tokens (all or nothing),
	// extended every TTL/3 while the request runs, released when it ends.
	// A request that finds no free units is denied like one the limiters
	// deny. Limiters may then return none. Defaults to nil: no lease.
	// Weight without Semaphore is an invalid Config.
	Semaphore *pgratelimit.Semaphore

	// Weight returns the units of a request's lease. Defaults to 1.
	Weight func(ctx context.Context, r R) int64

	// FailOpen lets requests through (Pass) when the check fails. Defaults
	// to false: Unavailable.
	FailOpen bool

	// Shadow checks every request but denies none: every Decision is Pass
	// or Exempt, and would-be denials and refusals are logged at Warn.
	Shadow bool

	// CheckTimeout bounds each check. Defaults to DefaultCheckTimeout; a
	// negative value sets no bound but the request's context.
	CheckTimeout time.Duration

	// Logger receives failed checks and, in shadow mode, would-be denials
	// and refusals. Defaults to slog.Default().
	Logger *slog.Logger

	// ReportEnded makes a check that fails after the request's own context
	// ended Ended (not logged: answering is moot) rather than a failure
	// like any other (logged, Unavailable or Pass). Defaults to false.
	ReportEnded bool
}

// Core checks the requests of one middleware. Make it with New. It is safe
// for concurrent use.
type Core[R any] struct {
	cfg Config[R]
	// The log messages, made once.
	failed, wouldDeny, notChecked string
}

// New returns a Core with cfg, its defaults filled in, that checks every
// request against limiters unless cfg.Limiters picks them. A Config that
// cannot check anything (no limiter, no Limiters, no Semaphore), a nil
// limiter, or a Weight without a Semaphore, is an error wrapping
// pgratelimit.ErrInvalidConfig that names the field (the adapters' Config
// fields have the same names).
func New[R any](cfg Config[R], limiters []*pgratelimit.Limiter) (*Core[R], error) {
	if err := cfg.validate(limiters); err != nil {
		return nil, fmt.Errorf("%w: %s: %s", pgratelimit.ErrInvalidConfig, cfg.Name, err)
	}
	if cfg.Limiters == nil {
		limiters = slices.Clone(limiters)
		cfg.Limiters = func(context.Context, R, string) ([]*pgratelimit.Limiter, error) { return limiters, nil }
	}
	if cfg.Cost == nil {
		cfg.Cost = func(context.Context, R) int64 { return 1 }
	}
	if cfg.Weight == nil {
		cfg.Weight = func(context.Context, R) int64 { return 1 }
	}
	if cfg.CheckTimeout == 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Core[R]{
		cfg:        cfg,
		failed:     cfg.Name + ": rate-limit check failed",
		wouldDeny:  cfg.Name + ": shadow: would deny",
		notChecked: cfg.Name + ": shadow: " + cfg.Noun + " not checked",
	}, nil
}

// validate says what is wrong with cfg and limiters, or nil.
func (cfg Config[R]) validate(limiters []*pgratelimit.Limiter) error {
	switch {
	case cfg.Name == "" || cfg.Noun == "" || cfg.Key == nil:
		return errors.New("the core needs a Name, a Noun and a Key") // the adapter's bug
	case slices.Contains(limiters, nil):
		return fmt.Errorf("limiter %d is nil", slices.Index(limiters, nil))
	case len(limiters) == 0 && cfg.Limiters == nil && cfg.Semaphore == nil:
		return errors.New("nothing to check: no limiter given, no Config.Limiters and no Config.Semaphore")
	case cfg.Weight != nil && cfg.Semaphore == nil:
		return errors.New("a weight without a semaphore: Config.Weight needs Config.Semaphore")
	}
	return nil
}

// Verdict is what an adapter does with a request. The zero Verdict is none
// of them: an adapter that meets it (a Decision that no Check made) answers
// as it does Unavailable, in its switch's default, so that nothing goes on
// unchecked by mistake.
type Verdict int

const (
	// Exempt: the request was not checked (Config.Exempt). Go on, without
	// rate-limit fields.
	Exempt Verdict = iota + 1
	// Pass: go on without rate-limit fields; shadow mode, or a failed check
	// failing open (Decision.Err is the failure).
	Pass
	// Allow: go on, with Decision.Fields.
	Allow
	// Deny: the request is rate limited; answer with Decision.Fields (which
	// have RetryAfter).
	Deny
	// Invalid: the request could not be checked through its own fault (no
	// key, no limiters, an invalid key or cost): Decision.Err.
	Invalid
	// Unavailable: the check failed (Decision.Err) and the middleware fails
	// closed.
	Unavailable
	// Ended: the request's context ended during a failed check
	// (Config.ReportEnded); Decision.Err is the context's error.
	Ended
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case Exempt:
		return "exempt"
	case Pass:
		return "pass"
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Invalid:
		return "invalid"
	case Unavailable:
		return "unavailable"
	case Ended:
		return "ended"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Decision is the outcome of a Check.
type Decision struct {
	// Verdict says what to do with the request.
	Verdict Verdict
	// Err is why a request is Invalid, Unavailable or Ended, or the failure
	// a request Passes despite.
	Err error
	// Key, Limiters, Semaphore and Result are the check's, when it was
	// made: Result.Results has the limiters' results, in order, then the
	// semaphore's when there is one.
	Key       string
	Limiters  []*pgratelimit.Limiter
	Semaphore *pgratelimit.Semaphore
	Result    pgratelimit.MultiResult
	// Fields are the rate-limit fields to send with an Allow or a Deny.
	Fields Fields
}

// Reported is the index, in Limiters and Result.Results, of the limit the
// RateLimit field reports: the one that denied with the longest wait, or,
// when allowed, the one with the smallest share of its quota left. Only for
// a Decision with a Result.
func (d Decision) Reported() int { return closest(d.Result) }

// Prefix is the Config.Prefix of the limiter that Reported names, or the
// semaphore's SemaphoreConfig.Prefix.
func (d Decision) Prefix() string {
	if i := d.Reported(); i < len(d.Limiters) {
		return d.Limiters[i].Config().Prefix
	}
	return d.Semaphore.Config().Prefix
}

// nothing is the release func of a check that holds nothing.
func nothing() {}

// Check decides what to do with r, whose context is ctx. The release func is
// never nil: call it when the request has ended, also when its handler
// panics (defer it), whatever the Decision.
func (c *Core[R]) Check(ctx context.Context, r R) (Decision, func()) {
	if c.cfg.Exempt != nil && c.cfg.Exempt(ctx, r) {
		return Decision{Verdict: Exempt}, nothing
	}
	key, err := c.cfg.Key(ctx, r)
	if err != nil {
		return c.refuse(ctx, r, err), nothing
	}
	limiters, err := c.cfg.Limiters(ctx, r, key)
	if err != nil {
		return c.refuse(ctx, r, err), nothing
	}
	cost := c.cfg.Cost(ctx, r)
	var weight int64
	if c.cfg.Semaphore != nil {
		weight = c.cfg.Weight(ctx, r)
	}
	res, err := c.allow(ctx, limiters, key, cost, weight)
	d := c.decide(ctx, r, Decision{Key: key, Limiters: limiters, Semaphore: c.cfg.Semaphore, Result: res}, err)
	return d, c.hold(ctx, r, d)
}

// allow charges key cost tokens of each limiter and a lease of weight units
// of the semaphore, if any, all or none, within the check timeout, as a
// shadow check in shadow mode.
func (c *Core[R]) allow(ctx context.Context, limiters []*pgratelimit.Limiter, key string, cost, weight int64) (pgratelimit.MultiResult, error) {
	if c.cfg.CheckTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.CheckTimeout)
		defer cancel()
	}
	if c.cfg.Shadow {
		ctx = pgratelimit.WithShadow(ctx)
	}
	charges := make([]pgratelimit.Charge, len(limiters), len(limiters)+1)
	for i, l := range limiters {
		charges[i] = l.Charge(key, cost)
	}
	if c.cfg.Semaphore != nil {
		charges = append(charges, c.cfg.Semaphore.Charge(key, weight))
	}
	return pgratelimit.AllowAll(ctx, charges...)
}

// decide completes d, the check of r, which failed with err if not nil.
func (c *Core[R]) decide(ctx context.Context, r R, d Decision, err error) Decision {
	switch {
	case err != nil && IsInputError(err):
		return c.refuse(ctx, r, err)
	case err != nil && c.cfg.ReportEnded && ctx.Err() != nil:
		// The request's own context ended: answering it is moot.
		return Decision{Verdict: Ended, Err: ctx.Err()}
	case err != nil:
		open := c.cfg.FailOpen || c.cfg.Shadow
		c.cfg.Logger.ErrorContext(ctx, c.failed, c.attrs(r, "error", err, "fail_open", open)...)
		if open {
			return Decision{Verdict: Pass, Err: err}
		}
		return Decision{Verdict: Unavailable, Err: err}
	case c.cfg.Shadow:
		if !d.Result.Allowed {
			c.cfg.Logger.WarnContext(ctx, c.wouldDeny,
				c.attrs(r, "key", d.Key, "prefix", d.Prefix(), "retry_after", d.Result.RetryAfter)...)
		}
		d.Verdict = Pass
		return d
	case d.Result.Allowed:
		d.Verdict = Allow
	default:
		d.Verdict = Deny
	}
	d.Fields = FieldsForAll(d.Limiters, d.Semaphore, d.Result)
	return d
}

// refuse decides about r, which could not be checked through its own fault
// (err): Invalid, or Pass in shadow mode (logged).
func (c *Core[R]) refuse(ctx context.Context, r R, err error) Decision {
	if c.cfg.Shadow {
		c.cfg.Logger.WarnContext(ctx, c.notChecked, c.attrs(r, "error", err)...)
		return Decision{Verdict: Pass, Err: err}
	}
	return Decision{Verdict: Invalid, Err: err}
}

// attrs is the log attributes of r, then kv.
func (c *Core[R]) attrs(r R, kv ...any) []any {
	if c.cfg.Attrs == nil {
		return kv
	}
	return append(c.cfg.Attrs(r), kv...)
}

// IsInputError reports whether err is pgratelimit's refusal of a key or a
// cost: the request's fault, not the database's.
func IsInputError(err error) bool {
	return errors.Is(err, pgratelimit.ErrInvalidKey) || errors.Is(err, pgratelimit.ErrInvalidCost) ||
		errors.Is(err, pgratelimit.ErrCostExceedsCapacity)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// leasesMore ends the help of the lease commands: the line acquire prints,
// for scripts.
const leasesMore = `acquire prints the lease ID first, so that a script can keep it:
  out=$(pgratelimit acquire KEY --max 2 --ttl 30s) || exit  # 1: no free unit
  id=${out%% *}
  ... pgratelimit extend KEY "$id" --ttl 30s (every TTL/3 while working) ...
  pgratelimit release KEY "$id"
(an ID with spaces or quotes is printed quoted; --json gives it as "id").
Exit status: 0 acquired, extended, released or not held; 1 no free units, or
a lease that expired (or is not held, for extend); 2 bad usage or an error.
`

// withLeasePolicy adds the flags of the lease commands' semaphore: its
// namespace and its storage.
func (f *flags) withLeasePolicy() *flags {
	f.StringVar(&f.prefix, "prefix", "leases", "the semaphore's key namespace (SemaphoreConfig.Prefix; not a limiter's: keys' rows hold either a bucket or leases)")
	f.StringVar(&f.storage, "storage", "durable", "durable or ephemeral: the table of the keys' rows, logged or unlogged (SemaphoreConfig.Storage)")
	return f
}

// withSemaphore runs a lease command (runOn) on a semaphore of the flags'
// prefix and storage, a Max of 1 and a TTL of 1s unless check, run on the
// positional arguments first, sets them (a release, an extension or a
// listing does not need them: the library checks them all the same).
func (f *flags) withSemaphore(ctx context.Context, args []string, nargs int, check func(cfg *pgratelimit.SemaphoreConfig) error,
	fn func(ctx context.Context, s *pgratelimit.Semaphore, pos []string) (int, error)) int {
	open := func(ctx context.Context, pos []string) (*pgratelimit.Semaphore, func(), error) {
		cfg := pgratelimit.SemaphoreConfig{Prefix: f.prefix, Max: 1, TTL: time.Second}
		err := check(&cfg)
		if err == nil {
			cfg.Storage, err = f.storageFlag()
		}
		if err != nil {
			return nil, nil, err
		}
		pool, err := f.pool(ctx)
		if err != nil {
			return nil, nil, err
		}
		s, err := pgratelimit.NewSemaphore(pool, cfg)
		if err != nil {
			pool.Close()
			return nil, nil, configError(err)
		}
		return s, pool.Close, nil
	}
	return runOn(f, ctx, args, nargs, open, fn)
}

// maxIfGiven is the check of a lease command whose --max is optional: the
// semaphore's Max when given.
func maxIfGiven(f *flags, max *int64) func(cfg *pgratelimit.SemaphoreConfig) error {
	return func(cfg *pgratelimit.SemaphoreConfig) error {
		if f.Changed("max") {
			cfg.Max = *max
		}
		return nil
	}
}

// required says a required flag, name, is missing: why is what it gives.
func (f *flags) required(name, why string) error {
	if !f.Changed(name) {
		return usagef("--%s is required: %s", name, why)
	}
	return nil
}

// shownID is a lease ID as the text output shows it: as it is, or quoted
// when it holds spaces, quotes or other characters that would split or
// garble a line (the IDs the library makes never do).
func shownID(id string) string {
	if id == "" || strings.ContainsFunc(id, func(r rune) bool { return unicode.IsSpace(r) || r == '"' || r == '\\' || !unicode.IsPrint(r) }) {
		return strconv.Quote(id)
	}
	return id
}

// units says n units: "1 unit", "3 units".
func units(n int64) string { return human.Plural(n, "unit", "units") }

// expiresIn is how long lease l still counts, by this machine's clock (0
// once past).
func expiresIn(l pgratelimit.Lease, now time.Time) time.Duration { return max(l.ExpiresAt.Sub(now), 0) }

// liveLease returns key's live lease id, or nil if it has none (or id is
// ""): release tells by it whether the lease was held.
func liveLease(ctx context.Context, s *pgratelimit.Semaphore, key, id string) (*pgratelimit.Lease, error) {
	if id == "" {
		return nil, nil
	}
	ls, err := s.Leases(ctx, key)
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if l.ID == id {
			return &l, nil
		}
	}
	return nil, nil
}

// leaseJSON is a lease for --json.
type leaseJSON struct {
	ID          string    `json:"id"`
	Weight      int64     `json:"weight"`
	Token       int64     `json:"token"`
	AcquiredAt  time.Time `json:"acquired_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	ExpiresInMS int64     `json:"expires_in_ms"` // by this machine's clock
}

func leaseJSONOf(l pgratelimit.Lease, expiresIn time.Duration) *leaseJSON {
	return &leaseJSON{ID: l.ID, Weight: l.Weight, Token: l.Token, AcquiredAt: l.AcquiredAt.UTC(), ExpiresAt: l.ExpiresAt.UTC(),
		ExpiresInMS: expiresIn.Milliseconds()}
}

// acquireJSON is an acquisition's result for --json: the lease's fields
// (id first) when acquired. Held is the units the key's live leases hold
// (this one included), Limit the --max; RetryAfterMS, when denied, is how
// long until enough of them expire unless released or extended before.
type acquireJSON struct {
	Key      string `json:"key"`
	Acquired bool   `json:"acquired"`
	*leaseJSON
	Weight       int64  `json:"weight"`
	Held         int64  `json:"held"`
	Limit        int64  `json:"limit"`
	RetryAfterMS *int64 `json:"retry_after_ms"` // null: never
	Waited       bool   `json:"waited,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
	Replayed     *bool  `json:"replayed,omitempty"`
}

// waitGrace is how long past --timeout acquire --wait's context lasts: the
// wait ends at --timeout (SemaphoreConfig.MaxWait), and its last try needs
// the database a moment more.
const waitGrace = 2 * time.Second

func runAcquire(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "acquire").withLeasePolicy()
	max := f.Int64("max", 0, "the most units a key's live leases hold (SemaphoreConfig.Max; required)")
	ttl := f.Duration("ttl", 0, "how long the lease counts unless extended (SemaphoreConfig.TTL; required)")
	weight := f.Int64("weight", 1, "the units the lease holds, at most --max")
	requestID := f.String("request-id", "", "an idempotency key, which becomes the lease's ID: a repeat while the lease lives takes nothing and prints it, saying it was replayed")
	wait := f.Bool("wait", false, "wait for free units (woken by releases) up to --timeout, instead of exiting 1 at once")
	f.input("--weight", pgratelimit.ErrInvalidCost, pgratelimit.ErrCostExceedsCapacity)
	f.input("--request-id", pgratelimit.ErrInvalidRequestID)
	check := func(cfg *pgratelimit.SemaphoreConfig) error {
		if err := f.required("max", "the most units a key's live leases hold (SemaphoreConfig.Max)"); err != nil {
			return err
		}
		if err := f.required("ttl", "how long a lease counts unless extended, such as 30s (SemaphoreConfig.TTL)"); err != nil {
			return err
		}
		cfg.Max, cfg.TTL = *max, *ttl
		if *wait && f.timeout > 0 {
			cfg.MaxWait, f.grace = f.timeout, waitGrace
		}
		return nil
	}
	return f.withSemaphore(ctx, args, 1, check, func(ctx context.Context, s *pgratelimit.Semaphore, pos []string) (int, error) {
		key, id := pos[0], *requestID
		if id != "" {
			ctx = pgratelimit.WithRequestID(ctx, id)
		}
		var r pgratelimit.LeaseResult
		var err error
		gaveUp := false // a wait (within SemaphoreConfig.MaxWait: --timeout) ended without free units: r is its last denial
		if *wait {
			r, err = s.Wait(ctx, key, *weight)
			if gaveUp = errors.Is(err, pgratelimit.ErrWaitTooLong) && r.Limit > 0; gaveUp {
				err = nil
			}
		} else {
			r, err = s.Acquire(ctx, key, *weight)
		}
		switch {
		case errors.Is(err, pgratelimit.ErrRequestMismatch):
			return 0, explainf(err, "request ID %q holds a live lease of %q of another weight, not %d: nothing taken (a new lease needs a new ID)", id, key, *weight)
		case err != nil:
			return 0, err
		}
		// What it did, with the lease ID first when acquired.
		l, now := r.Lease, time.Now()
		left := l.ExpiresAt.Sub(l.AcquiredAt) // the TTL, by the database's clock
		if r.Replayed {
			left = expiresIn(l, now)
		}
		if f.json {
			j := acquireJSON{Key: key, Acquired: r.Allowed, Weight: *weight, Held: r.Limit - r.Remaining, Limit: r.Limit,
				RetryAfterMS: msOrNever(r.RetryAfter), Waited: gaveUp, RequestID: id}
			if r.Allowed {
				j.leaseJSON = leaseJSONOf(l, left)
			}
			if id != "" {
				j.Replayed = &r.Replayed
			}
			f.printJSON(j)
		} else {
			held := fmt.Sprintf("%s of %q (token %d): %d of %d held, expires %s", units(l.Weight), key, l.Token, r.Limit-r.Remaining, r.Limit, human.In(left, now))
			switch {
			case r.Replayed:
				fmt.Fprintf(c.stdout, "%s  replayed: request %q already holds this lease, acquired at %s (nothing taken now): %s\n",
					shownID(l.ID), id, l.AcquiredAt.Local().Format(time.DateTime+" MST"), held)
			case r.Allowed:
				fmt.Fprintf(c.stdout, "%s  acquired %s\n", shownID(l.ID), held)
			case gaveUp:
				fmt.Fprintf(c.stdout, "denied: waited %s (--timeout) for %s of %q, none came free: %d of %d held (nothing taken); %s\n",
					human.Duration(f.timeout), units(*weight), key, r.Limit-r.Remaining, r.Limit, leaseRetryText(r, now))
			default:
				fmt.Fprintf(c.stdout, "denied: %q has %d of %d units held, so not the %d asked for (nothing taken); %s\n",
					key, r.Limit-r.Remaining, r.Limit, *weight, leaseRetryText(r, now))
			}
		}
		if !r.Allowed {
			return exitDenied, nil
		}
		return exitOK, nil
	})
}

// leaseRetryText says when a denied acquisition may succeed: when enough
// leases expire, unless a release comes first.
func leaseRetryText(r pgratelimit.LeaseResult, now time.Time) string {
	if r.RetryAfter == pgratelimit.InfDuration {
		return "expiries alone will never free enough units (the weight is more than Max)"
	}
	return "retry " + human.In(r.RetryAfter, now) + ", when enough leases expire (sooner if one is released; --wait waits)"
}

// leaseStatusJSON is a release's or an extension's outcome for --json:
// status is released, not_held, extended or expired; the lease is the one
// extended, or the one released when it was seen live just before.
type leaseStatusJSON struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Status string `json:"status"`
	*leaseJSON
}

func runRelease(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "release").withLeasePolicy()
	max := f.Int64("max", 0, "the semaphore's Max: the release then wakes waiters (acquire --wait, Semaphore.Wait) only when the key was full (default: whenever it releases a lease)")
	f.input("LEASE-ID", pgratelimit.ErrInvalidRequestID)
	// A Max of 1 makes every key with a live lease full: the release of one
	// notifies the waiters. The TTL plays no part in a release.
	return f.withSemaphore(ctx, args, 2, maxIfGiven(f, max), func(ctx context.Context, s *pgratelimit.Semaphore, pos []string) (int, error) {
		key, id := pos[0], pos[1]
		// Whether it was held: Release answers nil either way.
		held, err := liveLease(ctx, s, key, id)
		if err != nil {
			return 0, err
		}
		err = s.Release(ctx, key, id)
		j := leaseStatusJSON{Key: key, ID: id}
		var line string
		code := exitOK
		switch {
		case errors.Is(err, pgratelimit.ErrLeaseExpired):
			j.Status, code = "expired", exitDenied
			line = fmt.Sprintf("lease %s of %q had expired: its units were free already, and may be another's now (nothing released; release sooner, or extend while working)", shownID(id), key)
		case err != nil:
			return 0, err
		case held == nil:
			j.Status = "not_held"
			line = fmt.Sprintf("lease %s of %q is not held (released before, never acquired, or expired and cleaned up): nothing to release", shownID(id), key)
		default:
			j.Status, j.leaseJSON = "released", leaseJSONOf(*held, 0)
			line = fmt.Sprintf("released lease %s of %q (%s, token %d): free again", shownID(id), key, units(held.Weight), held.Token)
		}
		f.emit(j, line)
		return code, nil
	})
}

func runExtend(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "extend").withLeasePolicy()
	ttl := f.Duration("ttl", 0, "how long the lease counts from now (SemaphoreConfig.TTL: the one it was acquired with; required)")
	f.input("LEASE-ID", pgratelimit.ErrInvalidRequestID)
	check := func(cfg *pgratelimit.SemaphoreConfig) error {
		cfg.TTL = *ttl // (Max plays no part in an extension)
		return f.required("ttl", "how long the lease counts from now, such as 30s (SemaphoreConfig.TTL)")
	}
	return f.withSemaphore(ctx, args, 2, check, func(ctx context.Context, s *pgratelimit.Semaphore, pos []string) (int, error) {
		key, id := pos[0], pos[1]
		l, err := s.Extend(ctx, key, id)
		j := leaseStatusJSON{Key: key, ID: id}
		var line string
		code := exitDenied
		switch {
		case errors.Is(err, pgratelimit.ErrLeaseExpired):
			j.Status = "expired"
			line = fmt.Sprintf("lease %s of %q had expired: its units may be another's now (nothing extended; acquire again)", shownID(id), key)
		case errors.Is(err, pgratelimit.ErrLeaseNotFound):
			j.Status = "not_held"
			line = fmt.Sprintf("lease %s of %q is not held (released, never acquired, or expired and cleaned up): nothing extended (acquire again)", shownID(id), key)
		case err != nil:
			return 0, err
		default:
			now := time.Now()
			j.Status, j.leaseJSON, code = "extended", leaseJSONOf(l, expiresIn(l, now)), exitOK
			line = fmt.Sprintf("extended lease %s of %q (%s, token %d): expires %s", shownID(id), key, units(l.Weight), l.Token, human.In(expiresIn(l, now), now))
		}
		f.emit(j, line)
		return code, nil
	})
}

// leasesJSON is a key's live leases for --json, oldest first; Limit is
// --max, when given.
type leasesJSON struct {
	Key    string       `json:"key"`
	Prefix string       `json:"prefix"`
	Held   int64        `json:"held"`
	Limit  int64        `json:"limit,omitempty"`
	Leases []*leaseJSON `json:"leases"`
}

func runLeases(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "leases").withLeasePolicy()
	max := f.Int64("max", 0, "the semaphore's Max, to show the units held of it")
	return f.withSemaphore(ctx, args, 1, maxIfGiven(f, max), func(ctx context.Context, s *pgratelimit.Semaphore, pos []string) (int, error) {
		key := pos[0]
		ls, err := s.Leases(ctx, key)
		if err != nil {
			return 0, err
		}
		now := time.Now()
		j := leasesJSON{Key: key, Prefix: f.prefix, Limit: *max, Leases: []*leaseJSON{}}
		for _, l := range ls {
			j.Held += l.Weight
			j.Leases = append(j.Leases, leaseJSONOf(l, expiresIn(l, now)))
		}
		switch {
		case f.json:
			f.printJSON(j)
			return exitOK, nil
		case len(ls) == 0:
			fmt.Fprintf(c.stdout, "no live leases of %q (prefix %q)\n", key, f.prefix)
			return exitOK, nil
		}
		of := ""
		if *max > 0 {
			of = fmt.Sprintf(" of %d", *max)
		}
		fmt.Fprintf(c.stdout, "%q: %s holding %s%s (prefix %q), oldest first:\n", key, human.Plural(int64(len(ls)), "live lease", "live leases"), units(j.Held), of, f.prefix)
		for _, l := range ls {
			fmt.Fprintf(c.stdout, "  %s  weight %d  token %d  acquired %s  expires %s\n",
				shownID(l.ID), l.Weight, l.Token, l.AcquiredAt.UTC().Format(eventTime), human.In(expiresIn(l, now), now))
		}
		return exitOK, nil
	})
}

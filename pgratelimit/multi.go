package pgratelimit

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Charge is one bucket that AllowAll takes from: Cost tokens of Limiter's
// bucket for Key.
type Charge struct {
	Limiter *Limiter
	Key     string
	Cost    int64
}

// MultiResult is the outcome of AllowAll.
type MultiResult struct {
	// Allowed says that every charge took its tokens; when false, none did
	// and nothing was written.
	Allowed bool
	// Results holds one Result per charge, in the order given. Results[i]
	// describes charge i's bucket as AllowN would: Allowed says whether that
	// bucket alone had enough tokens (so the caller can tell which limit
	// said no), Remaining is the bucket after the decision (unchanged when
	// the call is denied), RetryAfter and ResetAfter as for AllowN.
	Results []Result
	// RetryAfter is, when denied, how long until every charge would be
	// allowed (the largest RetryAfter among Results); 0 when allowed.
	RetryAfter time.Duration
}

// AllowAll charges several buckets at once, all or nothing: every charge
// takes its cost from its bucket if each bucket holds enough, else none takes
// anything and nothing is written. "10 per second and 1000 per day" on one
// API key, or "the user's credits and the organization's" for one job, are
// two charges of one call.
//
// It is one transaction of the same shape as a single check over all the
// charges' rows, locked in one global order (table, prefix, key), so no two
// calls can deadlock whatever order their charges are listed in. Charges of
// the same bucket (same Storage, Prefix and key) add up; durable and
// ephemeral limiters can be charged together. The transaction takes the
// settings of all its limiters: the smallest LockTimeout any of them sets,
// AsyncCommit only if every one has it, and the database's clock unless a
// limiter has a Config.Clock (a test's: the first charge's that has one).
// It is coalesced with other checks of the first charge's Client unless a
// charged Limiter has DisableCoalescing.
//
// Every Limiter must use the same pool; otherwise, and for a nil Limiter or
// no charges, the error wraps ErrInvalidConfig. A bad key, a cost below 1, or
// a cost (summed per bucket) above that bucket's Capacity is ErrInvalidKey,
// ErrInvalidCost or ErrCostExceedsCapacity, before any database access.
func AllowAll(ctx context.Context, charges ...Charge) (MultiResult, error) {
	start := time.Now()
	cl, first, err := newCall(ctx, charges)
	if err != nil {
		recordInvalid(ctx, start, charges)
		return MultiResult{}, err
	}
	var m MultiResult
	err = first.run(cl.q, settingsOf(charges), coalesces(charges), "check")
	if err == nil {
		m = cl.result()
	}
	record(ctx, start, m, err, charges)
	return m, err
}

// coalesces says whether every charged limiter coalesces.
func coalesces(charges []Charge) bool {
	for _, c := range charges {
		if c.Limiter.cfg.DisableCoalescing {
			return false
		}
	}
	return true
}

// settingsOf are the settings of a transaction of charges: the smallest
// LockTimeout set, asynchronous commit only if every limiter has it, the
// first clock set.
func settingsOf(charges []Charge) engine.Settings {
	set := charges[0].Limiter.settings()
	for _, c := range charges[1:] {
		o := c.Limiter.settings()
		if o.LockTimeout > 0 && (set.LockTimeout == 0 || o.LockTimeout < set.LockTimeout) {
			set.LockTimeout = o.LockTimeout
		}
		set.Async = set.Async && o.Async
		if set.Clock == nil {
			set.Clock = o.Clock
		}
	}
	return set
}

// call is a request of a call, and which of its charges each Charge given
// was (charges of one bucket are merged).
type call struct {
	q  *engine.Request
	of []int // Charge i of the call is q.Charges[of[i]]; nil: one Charge
}

// result is the outcome of a decided call, one Result per Charge given.
func (cl call) result() MultiResult {
	q := cl.q
	results := make([]Result, len(q.Outcomes))
	var retry time.Duration
	for i, o := range q.Outcomes {
		results[i] = resultOf(o)
		retry = max(retry, results[i].RetryAfter)
	}
	m := MultiResult{Allowed: q.Allowed, Results: results}
	if !q.Allowed {
		m.RetryAfter = retry
	}
	if cl.of != nil {
		m.Results = make([]Result, len(cl.of))
		for i, j := range cl.of {
			m.Results[i] = results[j]
		}
	}
	return m
}

// newCall validates charges, before any database access, and merges the
// charges of each bucket.
func newCall(ctx context.Context, charges []Charge) (call, *Limiter, error) {
	if len(charges) == 0 {
		return call{}, nil, fmt.Errorf("%w: AllowAll needs at least one charge", ErrInvalidConfig)
	}
	first := charges[0].Limiter
	id, err := requestID(ctx)
	if err != nil {
		return call{}, nil, err
	}
	cl := call{q: &engine.Request{Ctx: ctx, Kind: account.OpCharge, ID: id, Charges: make([]engine.Charge, 0, len(charges))}}
	if len(charges) > 1 {
		cl.of = make([]int, len(charges))
	}
	for i, c := range charges {
		if err := cl.add(i, c, first); err != nil {
			return call{}, nil, err
		}
	}
	return cl, first, nil
}

// add adds charge i, c, to cl, checked.
func (cl *call) add(i int, c Charge, first *Limiter) error {
	l := c.Limiter
	switch {
	case l == nil:
		return fmt.Errorf("%w: charge %d has a nil Limiter", ErrInvalidConfig, i)
	case l.client.pool != first.client.pool:
		return fmt.Errorf("%w: charge %d's Limiter uses another pool than charge 0's; AllowAll runs one transaction", ErrInvalidConfig, i)
	case l.tx != nil && (first.tx == nil || *l.tx != *first.tx):
		return fmt.Errorf("%w: charge %d's Limiter runs in another transaction (In) than charge 0's; AllowAll runs in charge 0's", ErrInvalidConfig, i)
	}
	if cl.q.ID != "" && l.cfg.AsyncCommit {
		return errAsyncID(l)
	}
	if err := validateKey(c.Key); err != nil {
		return err
	}
	if err := l.validateCost(c.Cost); err != nil {
		return err
	}
	q, r := cl.q, l.row(c.Key)
	j := 0
	for j < len(q.Charges) && q.Charges[j].Row != r {
		j++
	}
	if j == len(q.Charges) {
		q.Charges = append(q.Charges, l.charge(c.Key, 0))
	}
	if q.Charges[j].Cost > math.MaxInt64-c.Cost {
		// Past int64, so past every capacity.
		return fmt.Errorf("%w: the costs of %s of prefix %q add up to more than %d, capacity %d", ErrCostExceedsCapacity, quoteKey(c.Key), l.cfg.Prefix, int64(math.MaxInt64), l.p.Capacity)
	}
	q.Charges[j].Cost += c.Cost
	if cl.of != nil {
		cl.of[i] = j
	}
	if q.Charges[j].Cost > l.p.Capacity && !q.Charges[j].Grants {
		return fmt.Errorf("%w: the costs of %s of prefix %q add up to %d, capacity %d", ErrCostExceedsCapacity, quoteKey(c.Key), l.cfg.Prefix, q.Charges[j].Cost, l.p.Capacity)
	}
	return nil
}

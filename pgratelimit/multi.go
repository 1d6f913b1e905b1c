package pgratelimit

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
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
// ephemeral limiters can be charged together. The clock, LockTimeout and
// AsyncCommit of the first charge's Limiter apply to the transaction. It is
// coalesced with other checks of the pool unless a charged Limiter has
// DisableCoalescing.
//
// Every Limiter must use the same pool (and Client); otherwise, and for a nil Limiter or
// no charges, the error wraps ErrInvalidConfig. A bad key, a cost below 1, or
// a cost (summed per bucket) above that bucket's Capacity is ErrInvalidKey,
// ErrInvalidCost or ErrCostExceedsCapacity, before any database access.
func AllowAll(ctx context.Context, charges ...Charge) (MultiResult, error) {
	start := time.Now()
	q, first, err := newRequest(ctx, charges)
	if err != nil {
		recordInvalid(ctx, start, charges)
		return MultiResult{}, err
	}
	m, err := first.client.run(q, first, coalesces(charges), "check")
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

// newRequest validates charges, before any database access, and merges the
// charges of each bucket.
func newRequest(ctx context.Context, charges []Charge) (*request, *Limiter, error) {
	if len(charges) == 0 {
		return nil, nil, fmt.Errorf("%w: AllowAll needs at least one charge", ErrInvalidConfig)
	}
	first := charges[0].Limiter
	id, err := requestID(ctx)
	if err != nil {
		return nil, nil, err
	}
	q := &request{ctx: ctx, kind: account.OpCharge, id: id, charges: make([]charge, 0, len(charges))}
	if len(charges) > 1 {
		q.of = make([]int, len(charges))
	}
	for i, c := range charges {
		l := c.Limiter
		switch {
		case l == nil:
			return nil, nil, fmt.Errorf("%w: charge %d has a nil Limiter", ErrInvalidConfig, i)
		case l.client != first.client:
			return nil, nil, fmt.Errorf("%w: charge %d's Limiter uses another pool (or Client) than charge 0's; AllowAll runs one transaction", ErrInvalidConfig, i)
		}
		if err := validateKey(c.Key); err != nil {
			return nil, nil, err
		}
		if err := l.validateCost(c.Cost); err != nil {
			return nil, nil, err
		}
		r := l.row(c.Key)
		j := 0
		for j < len(q.charges) && q.charges[j].row != r {
			j++
		}
		if j == len(q.charges) {
			q.charges = append(q.charges, l.charge(c.Key, 0))
		}
		if q.charges[j].cost > math.MaxInt64-c.Cost {
			// Past int64, so past every capacity.
			return nil, nil, fmt.Errorf("%w: the costs of %s of prefix %q add up to more than %d, capacity %d", ErrCostExceedsCapacity, quoteKey(c.Key), l.cfg.Prefix, int64(math.MaxInt64), l.p.Capacity)
		}
		q.charges[j].cost += c.Cost
		if q.of != nil {
			q.of[i] = j
		}
		if q.charges[j].cost > l.p.Capacity && !q.charges[j].grants {
			return nil, nil, fmt.Errorf("%w: the costs of %s of prefix %q add up to %d, capacity %d", ErrCostExceedsCapacity, quoteKey(c.Key), l.cfg.Prefix, q.charges[j].cost, l.p.Capacity)
		}
	}
	return q, first, nil
}

package pgratelimit

import (
	"math"
	"time"
)

// expiryGranularity is what expires_at is rounded up to. Coarse rounding keeps
// expires_at unchanged across most updates of a busy row.
const expiryGranularity = time.Minute

// policy is a validated Config's bucket parameters: Capacity, Refill, and the
// schedule of the refills (a grid of Interval, or a Calendar's boundaries).
type policy struct {
	capacity int64
	refill   int64
	sched    schedule
}

// gridPolicy is the policy of a plain Interval: refills at every whole
// multiple of interval since the Unix epoch.
func gridPolicy(capacity, refill int64, interval time.Duration) policy {
	return policy{capacity: capacity, refill: refill, sched: grid{interval: interval}}
}

// schedule is p's schedule.
func (p policy) schedule() schedule { return p.sched }

// bucket is one row: tokens as of refilledAt, a boundary of the policy's
// schedule. A row with expiresAt <= now is full and is treated exactly like a
// missing row, and so is a placeholder row (refilledAt is the zero time) that
// a check inserted and never wrote.
type bucket struct {
	tokens     int64
	refilledAt time.Time
	expiresAt  time.Time
}

func (b bucket) same(o bucket) bool {
	return b.tokens == o.tokens && b.refilledAt.Equal(o.refilledAt) && b.expiresAt.Equal(o.expiresAt)
}

// fresh is the bucket of a key never seen before (or deleted, or expired):
// full, as of the latest boundary of its schedule. The schedule's phase is
// the policy's (the Unix epoch for a grid, the anchor for a calendar), not the
// row's, so a bucket that is deleted once full and created again refills at
// the same moments as one that was kept: cleanup never changes a decision.
func (p policy) fresh(now time.Time) bucket {
	return bucket{tokens: p.capacity, refilledAt: p.schedule().floor(now), expiresAt: now}
}

// load brings a stored bucket to now: expired rows become fresh, tokens above
// a lowered Capacity are clamped, and every boundary of the schedule in
// (refilledAt, now] adds Refill tokens (capped). refilledAt moves to the last
// of those boundaries, even when the cap cuts the refill short, and never
// backwards: a clock that is behind refilledAt adds nothing.
func (p policy) load(b bucket, now time.Time) bucket {
	if !now.Before(b.expiresAt) || b.refilledAt.IsZero() {
		return p.fresh(now)
	}
	b.tokens = min(b.tokens, p.capacity) // below zero: a debt (Settle, Debit), which refills repay
	s := p.schedule()
	n := s.count(b.refilledAt, now)
	if n == 0 {
		return b
	}
	b.tokens = min(addSat(b.tokens, mulSat(n, p.refill)), p.capacity)
	b.refilledAt = s.add(b.refilledAt, n) // the latest boundary <= now
	return b
}

// refillsFor is how many refills bring need more tokens (need > 0).
func (p policy) refillsFor(need int64) int64 {
	refills := need / p.refill
	if need%p.refill != 0 {
		refills++
	}
	return refills
}

// untilTokens is how long after now the bucket b (already loaded) holds at
// least want tokens, assuming no other check: until the boundary that brings
// the refills it lacks. Zero if it already does.
func (p policy) untilTokens(b bucket, now time.Time, want int64) time.Duration {
	need := addSat(want, -max(b.tokens, -math.MaxInt64)) // a debt adds to what is needed
	if need <= 0 {
		return 0
	}
	at := p.schedule().add(b.refilledAt, p.refillsFor(need))
	return max(at.Sub(now), 0) // Sub saturates
}

// horizon is how long after a new row's first check, of cost, the bucket is
// full again, at most (what untilTokens reports at that check, whenever it
// falls): the refills that cost takes, each a whole Interval for a grid (the
// first check falls at or after a boundary, so the bucket is full no later)
// or the longest span of the calendar's period (25 hours for a day, a week
// and an hour, 31 days and an hour), saturating. The engine stores it in a
// placeholder row's expires_at, which reads as missing whatever it holds:
// the bound only makes that check's UPDATE more likely to leave expires_at
// unchanged.
func (p policy) horizon(cost int64) time.Duration {
	if cost <= 0 {
		return 0
	}
	return durMulSat(p.schedule().longest(), p.refillsFor(min(cost, p.capacity)))
}

// result is what a check of the loaded bucket b reports after taking cost
// (taken says whether it did).
func (p policy) result(b bucket, now time.Time, cost int64, allowed bool) Result {
	r := Result{Allowed: allowed, Limit: p.capacity, Remaining: b.tokens}
	if !allowed {
		r.RetryAfter = p.untilTokens(b, now, cost)
	}
	r.ResetAfter = p.untilTokens(b, now, p.capacity)
	return r
}

// take applies a check of cost to the loaded bucket b. When allowed, the new
// bucket's expiresAt is the moment it is full again rounded up, and never
// earlier than it was.
func (p policy) take(b bucket, now time.Time, cost int64) (bucket, Result) {
	if b.tokens < cost {
		return b, p.result(b, now, cost, false)
	}
	b.tokens -= cost
	r := p.result(b, now, cost, true)
	b.expiresAt = p.expiry(b, now, r.ResetAfter)
	return b, r
}

// give adds n tokens to the loaded bucket b, capped at Capacity.
func (p policy) give(b bucket, now time.Time, n int64) (bucket, Result) {
	b.tokens = min(addSat(b.tokens, n), p.capacity)
	r := p.result(b, now, 0, true)
	b.expiresAt = p.expiry(b, now, r.ResetAfter)
	return b, r
}

// expiry is the expires_at to store: now+resetAfter rounded up to
// expiryGranularity, never before the stored one (a row only ever moves its
// expiry forward, which keeps most updates HOT when expires_at is indexed).
func (p policy) expiry(b bucket, now time.Time, resetAfter time.Duration) time.Time {
	// now+resetAfter is the boundary at which the bucket is full, also when
	// now is behind refilledAt.
	e := roundUp(timeAddSat(now, resetAfter), expiryGranularity)
	if e.Before(b.expiresAt) {
		return b.expiresAt
	}
	return e
}

func roundUp(t time.Time, d time.Duration) time.Time {
	r := t.Truncate(d)
	if r.Before(t) {
		r = r.Add(d)
	}
	return r
}

// maxTime is the latest time stored: PostgreSQL's timestamptz reaches year
// 294276, Go's time.Duration arithmetic from now reaches year 2262.
var maxTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// timeAddSat is t+d (d >= 0), or maxTime if that is later.
func timeAddSat(t time.Time, d time.Duration) time.Time {
	if s := maxTime.Sub(t); s < math.MaxInt64 && s <= d { // a saturated Sub is further than any d
		return maxTime
	}
	return t.Add(d)
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

// mulSat multiplies non-negative a and b, saturating at MaxInt64.
func mulSat(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

func durMulSat(d time.Duration, n int64) time.Duration {
	return time.Duration(mulSat(int64(d), n))
}

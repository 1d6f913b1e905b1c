package pgratelimit

import (
	"math"
	"math/big"
	"time"
)

// expiryGranularity is what expires_at is rounded up to. Coarse rounding keeps
// expires_at unchanged across most updates of a busy row, and makes a bucket
// that was full only briefly keep its refill grid (see bucket.load).
const expiryGranularity = time.Minute

// policy is a validated Config's bucket parameters.
type policy struct {
	capacity int64
	refill   int64
	interval time.Duration
}

// bucket is one row: tokens as of refilledAt, a point on the row's refill grid.
// A row with expiresAt <= now is full and is treated exactly like a missing
// row, and so is a placeholder row (refilledAt is the zero time) that a check
// inserted and never wrote.
type bucket struct {
	tokens     int64
	refilledAt time.Time
	expiresAt  time.Time
}

func (b bucket) same(o bucket) bool {
	return b.tokens == o.tokens && b.refilledAt.Equal(o.refilledAt) && b.expiresAt.Equal(o.expiresAt)
}

// fresh is the bucket of a key never seen before (or deleted, or expired):
// full, its refill grid starting now.
func (p policy) fresh(now time.Time) bucket {
	return bucket{tokens: p.capacity, refilledAt: now, expiresAt: now}
}

// load brings a stored bucket to now: expired rows become fresh, tokens above
// a lowered Capacity are clamped, and every whole Interval since refilledAt
// adds Refill tokens (capped). refilledAt moves by whole intervals only, even
// when the cap cuts the refill short, and never backwards: a clock that is
// behind refilledAt adds nothing.
func (p policy) load(b bucket, now time.Time) bucket {
	if !now.Before(b.expiresAt) || b.refilledAt.IsZero() {
		return p.fresh(now)
	}
	b.tokens = min(max(b.tokens, 0), p.capacity)
	n := intervalsBetween(b.refilledAt, now, p.interval)
	if n == 0 {
		return b
	}
	b.tokens = min(addSat(b.tokens, mulSat(n, p.refill)), p.capacity)
	b.refilledAt = addIntervals(b.refilledAt, n, p.interval) // n*interval <= now-refilledAt
	return b
}

// intervalsBetween is how many whole intervals fit from from to to (0 when
// to is not after from), also for gaps longer than a time.Duration's ~292
// years, where time.Sub saturates.
func intervalsBetween(from, to time.Time, interval time.Duration) int64 {
	if !to.After(from) {
		return 0
	}
	if d := to.Sub(from); d < math.MaxInt64 {
		return int64(d / interval)
	}
	ns := new(big.Int).Mul(big.NewInt(to.Unix()-from.Unix()), big.NewInt(int64(time.Second)))
	ns.Add(ns, big.NewInt(int64(to.Nanosecond()-from.Nanosecond())))
	n := ns.Quo(ns, big.NewInt(int64(interval)))
	if !n.IsInt64() {
		return math.MaxInt64
	}
	return n.Int64()
}

// addIntervals is t + n*interval, in steps that each fit a time.Duration.
func addIntervals(t time.Time, n int64, interval time.Duration) time.Time {
	step := math.MaxInt64 / int64(interval) // intervals per step
	for n > step {
		t = t.Add(time.Duration(step) * interval)
		n -= step
	}
	return t.Add(time.Duration(n) * interval)
}

// untilTokens is how long after now the bucket b (already loaded) holds at
// least want tokens, assuming no other check. Zero if it already does.
func (p policy) untilTokens(b bucket, now time.Time, want int64) time.Duration {
	need := want - b.tokens
	if need <= 0 {
		return 0
	}
	refills := need / p.refill
	if need%p.refill != 0 {
		refills++
	}
	// Whole intervals after refilledAt, minus what has passed since it.
	d := durMulSat(p.interval, refills)
	if passed := now.Sub(b.refilledAt); passed > 0 {
		d -= passed // d >= interval > passed here, no underflow
	} else {
		d = durAddSat(d, -passed)
	}
	return d
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
	// now+resetAfter is refilledAt + the whole intervals to full, also when
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

func timeAddSat(t time.Time, d time.Duration) time.Time {
	if maxTime.Sub(t) <= d {
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

func durAddSat(a, b time.Duration) time.Duration {
	return time.Duration(addSat(int64(a), int64(b)))
}

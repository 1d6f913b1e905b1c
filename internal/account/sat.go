package account

import (
	"math"
	"time"
)

// MaxTime is the latest time stored: PostgreSQL's timestamptz reaches year
// 294276, Go's time.Duration arithmetic from now reaches year 2262.
var MaxTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// Inf is the wait of something that never happens: a cost that refills
// alone can never cover.
const Inf = time.Duration(math.MaxInt64)

// AddSat is a+b, saturating at the int64 bounds.
func AddSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

// subSat is a-b, saturating (b never MinInt64 here: amounts are >= -MaxInt64).
func subSat(a, b int64) int64 {
	if b == math.MinInt64 {
		return AddSat(AddSat(a, math.MaxInt64), 1)
	}
	return AddSat(a, -b)
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

// timeAddSat is t+d (d >= 0), or MaxTime if that is later.
func timeAddSat(t time.Time, d time.Duration) time.Time {
	if s := MaxTime.Sub(t); s < math.MaxInt64 && s <= d { // a saturated Sub is further than any d
		return MaxTime
	}
	return t.Add(d)
}

// untilSat is t - now, at least 0; Sub saturates.
func untilSat(t, now time.Time) time.Duration { return max(t.Sub(now), 0) }

func roundUp(t time.Time, d time.Duration) time.Time {
	r := t.Truncate(d)
	if r.Before(t) {
		r = r.Add(d)
	}
	return r
}

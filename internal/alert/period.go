package alert

import (
	"math"
	"math/bits"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Window is the alert period of a limiter that refills every interval: the
// time an empty bucket takes to fill, ceil(capacity/refill) intervals
// (capacity, refill and interval > 0), saturating at the longest
// time.Duration.
func Window(capacity, refill int64, interval time.Duration) time.Duration {
	n := capacity / refill
	if capacity%refill != 0 {
		n++
	}
	hi, lo := bits.Mul64(uint64(n), uint64(interval))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(lo)
}

// Period is the alert period that now falls in: with a window (> 0), the
// window's whole multiples since the Unix epoch ("per refill to full"),
// else the period of the calendar schedule sched between two of its
// boundaries. start <= now < end, unless end saturates at account.MaxTime.
func Period(sched account.Schedule, window time.Duration, now time.Time) (start, end time.Time) {
	if window > 0 {
		g := account.Grid(window)
		start = g.Floor(now)
		return start, g.Add(start, 1)
	}
	start = sched.Floor(now)
	return start, sched.Add(start, 1)
}

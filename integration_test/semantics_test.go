package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// DESIGN.md's worked example: Capacity 20, Refill 5 every 10s.
func TestWorkedExample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := newLimiter(t, pgratelimit.Config{Prefix: "api", Capacity: 20, Refill: 5, Interval: 10 * time.Second, Clock: clock.Now})

	// t=0: five checks -> 15 left.
	for i := range 5 {
		r, err := l.Allow(ctx, "user-1")
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, int64(19-i), r.Remaining)
		require.Equal(t, int64(20), r.Limit)
	}
	r, err := l.Peek(ctx, "user-1")
	require.NoError(t, err)
	require.Equal(t, int64(15), r.Remaining)
	require.Equal(t, 10*time.Second, r.ResetAfter)

	// t=10s: 20 (capped).
	clock.Set(10 * time.Second)
	r, err = l.Peek(ctx, "user-1")
	require.NoError(t, err)
	require.Equal(t, int64(20), r.Remaining)
	require.Zero(t, r.ResetAfter)

	// t=15s: eighteen checks -> 2 left; the nineteenth and twentieth... are
	// denied when they ask for more than 2.
	clock.Set(15 * time.Second)
	for i := range 18 {
		r, err := l.Allow(ctx, "user-1")
		require.NoError(t, err)
		require.True(t, r.Allowed, "check %d at t=15s", i)
	}
	r, err = l.AllowN(ctx, "user-1", 3)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, int64(2), r.Remaining)
	require.Equal(t, 5*time.Second, r.RetryAfter, "the next refill is at t=20s, on the grid")

	// t=20s: 7.
	clock.Set(20 * time.Second)
	r, err = l.Peek(ctx, "user-1")
	require.NoError(t, err)
	require.Equal(t, int64(7), r.Remaining)
	require.Equal(t, 30*time.Second, r.ResetAfter, "13 tokens short: 3 refills, at t=50s")
}

// Steady traffic just under the refill period gets every request through:
// refills fall on a grid and partial progress is never lost.
func TestSteadyTraffic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		every   time.Duration
		allowed int
	}{
		{9900 * time.Millisecond, 100},
		{7 * time.Second, 72}, // 3 to start with + 69 refills in 693s
	} {
		t.Run(tc.every.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := newClock()
			l := newLimiter(t, pgratelimit.Config{Prefix: "steady", Capacity: 3, Refill: 1, Interval: 10 * time.Second, Clock: clock.Now})
			allowed := 0
			for i := range 100 {
				clock.Set(time.Duration(i) * tc.every)
				r, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				if r.Allowed {
					allowed++
				}
			}
			require.Equal(t, tc.allowed, allowed)
		})
	}
}

// A clock that goes backwards mints nothing, and refilled_at never moves back.
func TestClockBackwardsMintsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := newLimiter(t, pgratelimit.Config{Prefix: "clock", Capacity: 5, Refill: 1, Interval: time.Second, Clock: clock.Now})

	clock.Set(100 * time.Second)
	for range 5 {
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	// Back an hour: nothing refills, and the wait is counted from the real
	// grid point, not from the late clock.
	clock.Set(100*time.Second - time.Hour)
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, int64(0), r.Remaining)
	require.Equal(t, time.Hour+time.Second, r.RetryAfter)

	// Forward to 100.5s: still before the first refill at 101s.
	clock.Set(100*time.Second + 500*time.Millisecond)
	r, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, 500*time.Millisecond, r.RetryAfter)

	clock.Set(101 * time.Second)
	r, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, r.Allowed)
}

// Lowering Capacity for an existing prefix clamps stored tokens on read.
func TestCapacityLoweredClamps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	big, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 100, Refill: 1, Interval: time.Minute, Clock: clock.Now})
	require.NoError(t, err)
	r, err := big.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.Equal(t, int64(90), r.Remaining)

	small, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 5, Refill: 1, Interval: time.Minute, Clock: clock.Now})
	require.NoError(t, err)
	r, err = small.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(5), r.Remaining)
	require.Equal(t, int64(5), r.Limit)
	for range 5 {
		r, err = small.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err = small.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
}

func TestPeekResetRefund(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := newLimiter(t, pgratelimit.Config{Prefix: "prr", Capacity: 10, Refill: 2, Interval: time.Second, Clock: clock.Now})

	// Peek on an unknown key: full, and nothing written.
	r, err := l.Peek(ctx, "new")
	require.NoError(t, err)
	require.Equal(t, pgratelimit.Result{Allowed: true, Limit: 10, Remaining: 10}, r)

	r, err = l.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, 5*time.Second, r.ResetAfter)

	r, err = l.Peek(ctx, "k")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, time.Second, r.RetryAfter)

	r, err = l.Refund(ctx, "k", 3)
	require.NoError(t, err)
	require.Equal(t, int64(3), r.Remaining)
	require.Equal(t, 4*time.Second, r.ResetAfter)

	r, err = l.Refund(ctx, "k", 1000) // capped
	require.NoError(t, err)
	require.Equal(t, int64(10), r.Remaining)
	require.Zero(t, r.ResetAfter)

	_, err = l.AllowN(ctx, "k", 7)
	require.NoError(t, err)
	require.NoError(t, l.Reset(ctx, "k"))
	r, err = l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(10), r.Remaining)
	require.NoError(t, l.Reset(ctx, "never-seen"))
}

// Clock readings past 2262 (beyond int64 nanoseconds since the epoch) refill
// on the epoch's grid like any other: issue #31.
func TestGridPast2262(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2300, 1, 1, 0, 0, 7, 500_000_000, time.UTC)
	var mu sync.Mutex
	l := newLimiter(t, pgratelimit.Config{Prefix: "far", Capacity: 10, Refill: 1, Interval: 7 * time.Second,
		Clock: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	r, err := l.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	// 2300-01-01 00:00:07.5 is 3.5s past a boundary of the 7s grid (its
	// seconds since the epoch, 10413792007, are 3 past a multiple of 7):
	// full again after 5 refills, the first 3.5s from now.
	require.Equal(t, pgratelimit.Result{Allowed: true, Limit: 10, Remaining: 5, ResetAfter: 31500 * time.Millisecond}, r)
	mu.Lock()
	now = now.Add(14 * time.Second)
	mu.Unlock()
	r, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(6), r.Remaining, "two refills")
}

// Refills a century apart: the bucket's row lives until it is full, even
// past what a time.Duration reaches from the check (issue 40: it expired in
// 2318 and read as full).
func TestRefillsCenturiesAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var now atomic.Pointer[time.Time]
	at := func(year int) { tm := time.Date(year, 6, 1, 0, 0, 0, 0, time.UTC); now.Store(&tm) }
	at(2026)
	l := newLimiter(t, pgratelimit.Config{Prefix: "century", Capacity: 10, Refill: 1, Interval: 100 * 365 * 24 * time.Hour,
		Clock: func() time.Time { return *now.Load() }})
	r, err := l.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	for _, year := range []int{2318, 2319, 2368} {
		at(year)
		p, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, int64(3), p.Remaining, "in %d", year) // refills in 2069, 2169, 2269
	}
	r, err = l.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.False(t, r.Allowed)
}

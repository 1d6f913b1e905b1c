package integration_test

import (
	"context"
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

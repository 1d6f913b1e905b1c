package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// A monthly quota through the database: it resets on the 1st in Berlin (an
// absolute anchor), on each customer's own day (per-key anchors), across a
// February and with cleanup between the steps, which changes nothing.
func TestCalendarQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	clock := newClock()
	clock.t = time.Date(2028, 1, 20, 10, 0, 0, 0, berlin)
	quota, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "monthly", Capacity: 1000, Refill: 1000,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month, Location: berlin}, Clock: clock.Now})
	require.NoError(t, err)
	cleanup := func() {
		_, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now})
		require.NoError(t, err)
	}

	r, err := quota.AllowN(ctx, "acme", 1000)
	require.NoError(t, err)
	require.True(t, r.Allowed, "a first check mid-month gets the whole quota")
	r, err = quota.Allow(ctx, "acme")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, time.Date(2028, 2, 1, 0, 0, 0, 0, berlin).Sub(clock.Now()), r.RetryAfter, "renewed on the 1st at midnight in Berlin")
	cleanup()
	clock.t = time.Date(2028, 1, 31, 23, 59, 59, 0, berlin)
	r, err = quota.Allow(ctx, "acme")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	clock.t = time.Date(2028, 2, 1, 0, 0, 0, 0, berlin)
	cleanup()
	r, err = quota.AllowN(ctx, "acme", 1000)
	require.NoError(t, err)
	require.True(t, r.Allowed, "the quota is back on the 1st")

	// Customers whose cycles begin on the 31st and on the 3rd.
	day31 := quota.WithAnchor(time.Date(2027, 10, 31, 0, 0, 0, 0, berlin))
	day3 := quota.WithAnchor(time.Date(2027, 6, 3, 0, 0, 0, 0, berlin))
	clock.t = time.Date(2028, 2, 10, 12, 0, 0, 0, berlin)
	for _, l := range []*pgratelimit.Limiter{day31, day3} {
		r, err := l.AllowN(ctx, l.Config().Calendar.Anchor.Format("02"), 1000)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err = day31.Allow(ctx, "31")
	require.NoError(t, err)
	require.Equal(t, time.Date(2028, 2, 29, 0, 0, 0, 0, berlin).Sub(clock.Now()), r.RetryAfter, "the 31st falls on Feb 29 in 2028")
	r, err = day3.Allow(ctx, "03")
	require.NoError(t, err)
	require.Equal(t, time.Date(2028, 3, 3, 0, 0, 0, 0, berlin).Sub(clock.Now()), r.RetryAfter)
	clock.t = time.Date(2028, 2, 29, 0, 0, 0, 0, berlin)
	cleanup()
	r, err = day31.Allow(ctx, "31")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(999), r.Remaining)
	r, err = day3.Allow(ctx, "03")
	require.NoError(t, err)
	require.False(t, r.Allowed, "not until the 3rd")

	_, err = newLimiterOn(pool, pgratelimit.Config{Prefix: "both", Capacity: 1, Refill: 1, Interval: time.Hour,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Day}})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = newLimiterOn(pool, pgratelimit.Config{Prefix: "bad", Capacity: 1, Refill: 1, Calendar: pgratelimit.Calendar{Location: berlin}})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// A daily quota across Berlin's 23-hour day: the next day begins 23 hours
// after this one did.
func TestCalendarDSTDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	clock := newClock()
	clock.t = time.Date(2026, 3, 29, 0, 0, 0, 0, berlin)
	l := newLimiter(t, pgratelimit.Config{Prefix: "daily", Capacity: 5, Refill: 5,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Day, Location: berlin}, Clock: clock.Now})
	r, err := l.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, 23*time.Hour, r.ResetAfter, "March 29th, 2026 has 23 hours in Berlin")
}

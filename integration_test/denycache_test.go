package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// With the deny cache, checks of a denied key are denied locally until its
// RetryAfter has passed, counting down, without a transaction (here: while
// another transaction holds the row, which a database check would wait
// for); a smaller cost, a refund through another limiter of the prefix and
// the Client, or the retry time passing sends the check to the database
// again.
func TestDenyCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock()
	client := newClient(t, pool, pgratelimit.ClientConfig{})
	cfg := pgratelimit.Config{Prefix: "dc", Capacity: 3, Refill: 3, Interval: time.Minute, Clock: clock.Now, DenyCacheSize: 100}
	l := clientLimiter(t, client, cfg)
	r, err := l.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = l.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, time.Minute, r.RetryAfter)

	holder := lockRow(t, pool, "dc", "k")
	defer func() { _ = holder.Rollback(ctx) }()
	clock.Add(20 * time.Second)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	r, err = l.AllowN(short, "k", 2)
	require.NoError(t, err, "denied locally, without waiting for the held row")
	require.False(t, r.Allowed)
	require.Equal(t, 40*time.Second, r.RetryAfter, "counting down")
	_, err = l.AllowN(short, "k", 1)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a smaller cost asks the database")
	require.NoError(t, holder.Rollback(ctx))

	// A refund through another limiter of the prefix and client clears
	// the entry.
	other := clientLimiter(t, client, pgratelimit.Config{Prefix: "dc", Capacity: 3, Refill: 3, Interval: time.Minute, Clock: clock.Now})
	_, err = other.Refund(ctx, "k", 2)
	require.NoError(t, err)
	r, err = l.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	require.True(t, r.Allowed, "the refund is seen at once")

	r, err = l.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	clock.Add(40 * time.Second) // the refill
	r, err = l.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	require.True(t, r.Allowed, "once RetryAfter has passed, the database answers")

	_, err = newLimiterOn(pool, pgratelimit.Config{Prefix: "dc", Capacity: 3, Refill: 3, Interval: time.Minute, DenyCacheSize: -1})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

func TestWaitBlocksUntilAllowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(t, pgratelimit.Config{Prefix: "wait", Capacity: 2, Refill: 1, Interval: 200 * time.Millisecond})
	_, err := l.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	r, err := l.WaitN(ctx, "k", 2)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(0), r.Remaining)
}

func TestWaitReturnsAtOnceWhenTheDeadlineIsTooClose(t *testing.T) {
	t.Parallel()
	clock := newClock()
	clock.Set(time.Second) // a second past a refill: the next is 59m59s away
	l := newLimiter(t, pgratelimit.Config{Prefix: "wait", Capacity: 1, Refill: 1, Interval: time.Hour, Clock: clock.Now})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	r, err := l.Wait(ctx, "k")
	require.ErrorIs(t, err, pgratelimit.ErrWaitTooLong)
	require.NoError(t, ctx.Err(), "it returned without sleeping towards the deadline")
	require.False(t, r.Allowed)
	require.Greater(t, r.RetryAfter, 59*time.Minute)
}

func TestWaitMaxWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock() // on the hour: the refill is an hour away
	l := newLimiter(t, pgratelimit.Config{Prefix: "wait", Capacity: 1, Refill: 1, Interval: time.Hour, MaxWait: time.Second, Clock: clock.Now})
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	_, err = l.Wait(ctx, "k")
	require.ErrorIs(t, err, pgratelimit.ErrWaitTooLong)
	require.ErrorContains(t, err, "MaxWait")
}

func TestWaitCancelled(t *testing.T) {
	t.Parallel()
	clock := newClock() // standing still: the refill never comes while it waits
	l := newLimiter(t, pgratelimit.Config{Prefix: "wait", Capacity: 1, Refill: 1, Interval: 10 * time.Second, Clock: clock.Now})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	done := make(chan error)
	go func() {
		_, err := l.Wait(ctx, "k")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after cancel")
	}
	// Nothing was taken by the cancelled wait.
	r, err := l.Peek(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(0), r.Remaining)
}

package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// NewClient asks the database its dialect, and says so when it cannot.
func TestNewClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	c := newClient(t, pool, pgratelimit.ClientConfig{})

	down := unreachablePool(t)
	_, err := pgratelimit.NewClient(ctx, down, pgratelimit.ClientConfig{})
	require.Error(t, err, "a failed detection is an error, not a guess")
	require.ErrorContains(t, err, "dialect")

	_, err = pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{CoalesceConns: -1})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	require.ErrorContains(t, err, "ClientConfig.CoalesceConns")
	_, err = pgratelimit.NewClient(ctx, nil, pgratelimit.ClientConfig{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = c.NewLimiter(pgratelimit.Config{Prefix: "p"})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// A client's limiters check exactly as New's do; AllowAll takes limiters of
// one pool only, of one client or not.
func TestClientLimiters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	c := newClient(t, pool, pgratelimit.ClientConfig{CoalesceConns: 3})
	cfg := pgratelimit.Config{Prefix: "cl", Capacity: 5, Refill: 1, Interval: time.Hour}
	l := clientLimiter(t, c, cfg)
	for i := range 7 {
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, i < 5, r.Allowed, "check %d", i)
	}
	other := clientLimiter(t, newClient(t, pool, pgratelimit.ClientConfig{}), cfg)
	r, err := other.Peek(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, r.Remaining, "clients of one database share its buckets")
	m, err := pgratelimit.AllowAll(ctx, l.Charge("k", 1), other.Charge("j", 1))
	require.NoError(t, err, "limiters of two clients of one pool")
	require.False(t, m.Allowed, "k is empty")
	own, err := newLimiterOn(pool, cfg)
	require.NoError(t, err)
	m, err = pgratelimit.AllowAll(ctx, own.Charge("j", 1), other.Charge("i", 1))
	require.NoError(t, err, "a limiter of New's and a client's")
	require.True(t, m.Allowed)
	elsewhere, err := newLimiterOn(newPool(t), cfg)
	require.NoError(t, err)
	_, err = pgratelimit.AllowAll(ctx, l.Charge("k", 1), elsewhere.Charge("j", 1))
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument, "limiters of two pools")
}

// Close waits for the checks in flight, which are decided (exactly: what
// the callers were told is what the bucket lost), and later checks get
// ErrClosed without touching the database.
func TestClientCloseDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	c := newClient(t, pool, pgratelimit.ClientConfig{})
	const capacity = 1_000_000
	l := clientLimiter(t, c, pgratelimit.Config{Prefix: "drain", Capacity: capacity, Refill: 1, Interval: time.Hour})
	var allowed, closed atomic.Int64
	var wg sync.WaitGroup
	started := make(chan struct{}, 64)
	for g := range 64 {
		wg.Go(func() {
			keys := []string{"hot", "k" + string(rune('a'+g%8))}
			for i := 0; ; i++ {
				r, err := l.Allow(ctx, keys[i%2])
				if i == 0 {
					started <- struct{}{}
				}
				switch {
				case errors.Is(err, pgratelimit.ErrClosed):
					closed.Add(1)
					return
				case err != nil:
					t.Errorf("check: %v", err)
					return
				case r.Allowed && keys[i%2] == "hot":
					allowed.Add(1)
				}
			}
		})
	}
	for range 64 {
		<-started
	}
	require.NoError(t, c.Close(ctx))
	wg.Wait()
	require.Equal(t, int64(64), closed.Load(), "every caller saw ErrClosed once the client closed")
	_, err := l.Allow(ctx, "hot")
	require.ErrorIs(t, err, pgratelimit.ErrClosed)
	_, err = l.Peek(ctx, "hot")
	require.ErrorIs(t, err, pgratelimit.ErrClosed)

	audit, err := newLimiterOn(pool, l.Config())
	require.NoError(t, err)
	r, err := audit.Peek(ctx, "hot")
	require.NoError(t, err)
	require.Equal(t, capacity-allowed.Load(), r.Remaining, "the bucket lost exactly what callers were told")
}

// Close gives up when its context ends while a check waits for a row lock,
// and the check still finishes once the lock is released.
func TestClientCloseTimesOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	c := newClient(t, pool, pgratelimit.ClientConfig{})
	l := clientLimiter(t, c, pgratelimit.Config{Prefix: "slow", Capacity: 5, Refill: 1, Interval: time.Hour})
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	holder := lockRow(t, pool, "slow", "k")
	holderPID := holderID(t, holder)
	done := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, "k")
		done <- err
	}()
	require.Eventually(t, func() bool { return blockedBy(t, pool, holderPID) > 0 }, 10*time.Second, 5*time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Close(short), context.DeadlineExceeded)
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-done)
	require.NoError(t, c.Close(ctx))
}

package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// newSemaphore is pgratelimit.NewSemaphore on pool in the suite's mode.
func newSemaphore(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.SemaphoreConfig) *pgratelimit.Semaphore {
	t.Helper()
	cfg.DisableCoalescing = cfg.DisableCoalescing || perCheck
	s, err := pgratelimit.NewSemaphore(pool, cfg)
	require.NoError(t, err)
	return s
}

// The semantics of one key, by a fake clock: acquire up to Max, denied with
// the soonest expiry, release, extend, expiry, ErrLeaseExpired and
// ErrLeaseNotFound, Leases, and replays by request ID.
func TestLeaseSemantics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		t.Run(storage.String(), func(t *testing.T) {
			clock := newClock()
			s := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "jobs", Max: 3, TTL: 10 * time.Second, Storage: storage, Clock: clock.Now})

			a, err := s.Acquire(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, a.Acquired)
			require.Equal(t, int64(2), a.Held)
			require.Equal(t, int64(3), a.Limit)
			require.Equal(t, "k", a.Lease.Key)
			require.Equal(t, t0, a.Lease.AcquiredAt.UTC())
			require.Equal(t, t0.Add(10*time.Second), a.Lease.ExpiresAt.UTC())
			require.NotEmpty(t, a.Lease.ID)

			clock.Add(2 * time.Second)
			b, err := s.Acquire(ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, b.Acquired)
			require.Greater(t, b.Lease.Token, a.Lease.Token)

			c, err := s.Acquire(ctx, "k", 1)
			require.NoError(t, err)
			require.False(t, c.Acquired)
			require.Equal(t, int64(3), c.Held)
			require.Equal(t, 8*time.Second, c.RetryAfter)

			ls, err := s.Leases(ctx, "k")
			require.NoError(t, err)
			require.Len(t, ls, 2)
			require.Equal(t, a.Lease.ID, ls[0].ID)

			// Extend b; a expires at 10s.
			clock.Add(5 * time.Second)
			eb, err := s.Extend(ctx, "k", b.Lease.ID)
			require.NoError(t, err)
			require.Equal(t, t0.Add(17*time.Second), eb.ExpiresAt.UTC())
			clock.Set(10 * time.Second)
			c, err = s.Acquire(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, c.Acquired, "a's units are free at its expiry")

			require.ErrorIs(t, s.Release(ctx, "k", a.Lease.ID), pgratelimit.ErrLeaseExpired)
			_, err = s.Extend(ctx, "k", a.Lease.ID)
			require.ErrorIs(t, err, pgratelimit.ErrLeaseExpired)
			_, err = s.Extend(ctx, "k", "never")
			require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)

			require.NoError(t, s.Release(ctx, "k", b.Lease.ID))
			require.NoError(t, s.Release(ctx, "k", b.Lease.ID), "releasing twice is nil")
			_, err = s.Extend(ctx, "k", b.Lease.ID)
			require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)
			ls, err = s.Leases(ctx, "k")
			require.NoError(t, err)
			require.Len(t, ls, 1)
			require.Equal(t, c.Lease.ID, ls[0].ID)

			// Exactly once: the same request ID returns the same lease.
			rctx := pgratelimit.WithRequestID(ctx, "req-1")
			r1, err := s.Acquire(rctx, "k", 1)
			require.NoError(t, err)
			require.True(t, r1.Acquired)
			require.Equal(t, "req-1", r1.Lease.ID)
			r2, err := s.Acquire(rctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, r1.Lease, r2.Lease)
			_, err = s.Acquire(rctx, "k", 2)
			require.ErrorIs(t, err, pgratelimit.ErrRequestMismatch)
		})
	}
}

var _ = errors.Is

package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// credits is a limiter with grants: 10 credits a month (no refill within a
// test), on the test clock unless clock is nil.
func credits(t *testing.T, pool *pgxpool.Pool, prefix string, clock *fakeClock) *pgratelimit.Limiter {
	t.Helper()
	cfg := pgratelimit.Config{Prefix: prefix, Capacity: 10, Refill: 10, Interval: 30 * 24 * time.Hour, Grants: true}
	if clock != nil {
		cfg.Clock = clock.Now
	}
	l, err := newLimiterOn(pool, cfg)
	require.NoError(t, err)
	return l
}

// The README's example: a bucket holding 2 with 10 granted; a check of 4
// leaves the bucket at 0 and the grants at 8. A denied check takes from
// neither.
func TestGrantsSpillFromTheBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := credits(t, newPool(t), "spill", clock)
	r, err := l.AllowN(ctx, "k", 8)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(2), r.Remaining)
	require.Zero(t, r.Granted)
	g, err := l.Grant(ctx, "k", 10, time.Time{})
	require.NoError(t, err)
	require.Positive(t, g.ID)
	require.Equal(t, int64(10), g.Amount)

	r, err = l.AllowN(ctx, "k", 4)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(0), r.Remaining)
	require.Equal(t, int64(8), r.Granted)

	r, err = l.AllowN(ctx, "k", 9)
	require.NoError(t, err)
	require.False(t, r.Allowed, "8 granted, 0 in the bucket")
	require.Equal(t, int64(8), r.Granted)
	require.Positive(t, r.RetryAfter)

	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(0), p.Remaining)
	require.Equal(t, int64(8), p.Granted)
	require.True(t, p.Allowed, "grants allow a check of 1")
	gs, err := l.Grants(ctx, "k")
	require.NoError(t, err)
	require.Len(t, gs, 1)
	require.Equal(t, int64(8), gs[0].Amount)
	require.True(t, gs[0].ExpiresAt.IsZero())

	// A check above Capacity is allowed when grants cover it.
	r, err = l.AllowN(ctx, "k", 8)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Zero(t, r.Granted)
	r, err = l.AllowN(ctx, "k", 11)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, pgratelimit.InfDuration, r.RetryAfter, "refills alone never give 11 of a bucket of 10")
}

// Grants are spent soonest-expiring first, never-expiring last; a grant
// whose expiry has passed is refused.
func TestGrantsSoonestExpiringFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	l := credits(t, pool, "order", clock)
	r, err := l.AllowN(ctx, "k", 10) // empty the bucket
	require.NoError(t, err)
	require.True(t, r.Allowed)
	for _, g := range []struct {
		n   int64
		exp time.Time
	}{{5, t0.Add(time.Hour)}, {5, time.Time{}}, {5, t0.Add(10 * time.Minute)}} {
		_, err := l.Grant(ctx, "k", g.n, g.exp)
		require.NoError(t, err)
	}
	for _, exp := range []time.Time{t0.Add(-time.Minute), t0} {
		_, err = l.Grant(ctx, "k", 4, exp)
		require.ErrorIs(t, err, pgratelimit.ErrGrantExpired, "a grant expiring at %v", exp)
	}
	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(15), p.Granted, "the refused grants are not there")

	r, err = l.AllowN(ctx, "k", 7)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(8), r.Granted)
	gs, err := l.Grants(ctx, "k")
	require.NoError(t, err)
	require.Len(t, gs, 2, "the 10-minute grant is spent")
	require.Equal(t, int64(3), gs[0].Amount, "then the one-hour grant")
	require.Equal(t, t0.Add(time.Hour), gs[0].ExpiresAt.UTC())
	require.Equal(t, int64(5), gs[1].Amount, "the never-expiring one is untouched")

	clock.Add(time.Hour) // the one-hour grant expires with 3 left
	r, err = l.AllowN(ctx, "k", 6)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, int64(5), r.Granted)
	r, err = l.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Zero(t, r.Granted)

	// Cleanup deletes the spent and expired grants, and changes nothing.
	before, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	n, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(3))
	after, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, before, after)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgratelimit_grants`).Scan(&left))
	require.Zero(t, left)
}

// Without Config.Grants nothing about grants changes: costs above Capacity
// are errors, and Grant refuses.
func TestGrantsOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "off", Capacity: 10, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "k", 11)
	require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
	_, err = l.Grant(ctx, "k", 5, time.Time{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	on := credits(t, pool, "on", nil)
	_, err = on.Grant(ctx, "k", 0, time.Time{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidCost)
	_, err = on.Grant(ctx, "", 1, time.Time{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
	_, err = newLimiterOn(pool, pgratelimit.Config{Prefix: "e", Capacity: 1, Refill: 1, Interval: time.Hour, Grants: true, Storage: pgratelimit.Ephemeral})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// AllowAll with grants: all or nothing, the grants included.
func TestGrantsInAllowAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock()
	user := credits(t, pool, "user", clock)
	perSecond, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "rate", Capacity: 2, Refill: 2, Interval: time.Second, Clock: clock.Now})
	require.NoError(t, err)
	_, err = user.Grant(ctx, "u", 20, time.Time{})
	require.NoError(t, err)
	charge := func(cost int64) pgratelimit.MultiResult {
		m, err := pgratelimit.AllowAll(ctx, user.Charge("u", cost), perSecond.Charge("u", 1))
		require.NoError(t, err)
		return m
	}
	require.True(t, charge(15).Allowed)
	require.True(t, charge(10).Allowed)
	m := charge(3)
	require.False(t, m.Allowed, "the rate limit says no")
	require.True(t, m.Results[0].Allowed, "the credits had enough")
	require.Equal(t, int64(5), m.Results[0].Granted, "and nothing was taken from them")
	clock.Add(time.Second)
	m = charge(3)
	require.True(t, m.Allowed)
	require.Equal(t, int64(2), m.Results[0].Granted)
}

// In the caller's transaction, through every driver: spent only if it
// commits; a grant in the caller's transaction (In) exists only if it commits.
func TestGrantsInCallerTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	l := credits(t, pool, "tx", nil)
	for _, d := range drivers(t, s, pool) {
		key := "k-" + d.name
		r, err := l.AllowN(ctx, key, 10)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		_, err = l.Grant(ctx, key, 6, time.Time{})
		require.NoError(t, err)
		tx := d.begin(t)
		r, err = tx.allowN(l, key, 4)
		require.NoError(t, err, d.name)
		require.True(t, r.Allowed, d.name)
		require.Equal(t, int64(2), r.Granted, d.name)
		require.NoError(t, tx.rollback())
		p, err := l.Peek(ctx, key)
		require.NoError(t, err)
		require.Equal(t, int64(6), p.Granted, d.name+": rolled back")
		tx = d.begin(t)
		_, err = tx.allowN(l, key, 4)
		require.NoError(t, err)
		require.NoError(t, tx.commit())
		p, err = l.Peek(ctx, key)
		require.NoError(t, err)
		require.Equal(t, int64(2), p.Granted, d.name+": committed")
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = l.In(pgratelimit.PgxTx(tx)).Grant(ctx, "bought", 100, time.Time{})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	p, err := l.Peek(ctx, "bought")
	require.NoError(t, err)
	require.Zero(t, p.Granted, "a rolled-back purchase grants nothing")
}

// 64 goroutines spending one key's bucket and grants (some expiring, some
// not, one granted while they run) never spend more than it holds, and what
// they were told adds up to exactly what the key lost.
func TestGrantsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	grantsHammer(t, newPool(t))
}

// The same through PgBouncer in transaction mode.
func TestGrantsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	grantsHammer(t, pgbouncerPool(t))
}

func grantsHammer(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "hammer", Capacity: 100, Refill: 1, Interval: 24 * time.Hour, Grants: true, LockTimeout: 10 * time.Second})
	require.NoError(t, err)
	far := time.Now().Add(24 * time.Hour)
	for _, g := range []int64{50, 30, 20} {
		_, err := l.Grant(ctx, "k", g, far)
		require.NoError(t, err)
	}
	_, err = l.Grant(ctx, "k", 40, time.Time{})
	require.NoError(t, err)
	const held = 100 + 50 + 30 + 20 + 40 + 60 // the bucket, the grants, and one more below

	var mu sync.Mutex
	var spent int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range 12 {
				cost := 1 + rng.Int64N(9)
				if w%8 == 0 {
					cost += 100 // above Capacity: only grants can cover these
				}
				r, err := l.AllowN(ctx, "k", cost)
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				if r.Allowed {
					mu.Lock()
					spent += cost
					mu.Unlock()
				}
			}
		})
		if w == 32 {
			_, err := l.Grant(ctx, "k", 60, time.Time{})
			require.NoError(t, err)
		}
	}
	wg.Wait()
	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.LessOrEqual(t, spent, int64(held), "never more than it holds")
	require.Equal(t, int64(held)-spent, p.Remaining+p.Granted, fmt.Sprintf("spent %d of %d; %d left in the bucket, %d granted", spent, held, p.Remaining, p.Granted))
	require.Greater(t, spent, int64(held)-20, "64 x 12 checks of up to 109 leave little")
}

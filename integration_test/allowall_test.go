package integration

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// Per second and per day on one key: when the day bucket denies, the second
// bucket is untouched and Results says which one said no.
func TestAllowAllPerSecondAndPerDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	perSec, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "sec", Capacity: 10, Refill: 10, Interval: time.Second, Clock: clock.Now})
	require.NoError(t, err)
	perDay, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "day", Capacity: 25, Refill: 25, Interval: 24 * time.Hour, Clock: clock.Now})
	require.NoError(t, err)
	both := func(cost int64) pgratelimit.MultiResult {
		m, err := pgratelimit.AllowAll(ctx, perSec.Charge("api-key", cost), perDay.Charge("api-key", cost))
		require.NoError(t, err)
		return m
	}
	for range 2 {
		require.True(t, both(10).Allowed)
		clock.Add(time.Second)
	}
	// 5 left today, 10 this second.
	m := both(6)
	require.False(t, m.Allowed)
	require.True(t, m.Results[0].Allowed, "the per-second bucket had enough")
	require.Equal(t, int64(10), m.Results[0].Remaining)
	require.False(t, m.Results[1].Allowed, "the daily bucket said no")
	require.Equal(t, int64(5), m.Results[1].Remaining)
	require.Equal(t, m.Results[1].RetryAfter, m.RetryAfter)
	require.Equal(t, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC).Sub(clock.Now()), m.RetryAfter, "a daily grid refills at midnight UTC")
	p, err := perSec.Peek(ctx, "api-key")
	require.NoError(t, err)
	require.Equal(t, int64(10), p.Remaining, "the per-second bucket is untouched")

	m = both(5)
	require.True(t, m.Allowed)
	require.Zero(t, m.RetryAfter)
	require.Equal(t, []int64{5, 0}, []int64{m.Results[0].Remaining, m.Results[1].Remaining})
}

// 64 goroutines charge two buckets of different capacities: the allowed
// checks never exceed the smaller bucket and each bucket's spent tokens equal
// the allowed costs exactly.
func TestAllowAllExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	small, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "small", Capacity: 37, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	big, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "big", Capacity: 100, Refill: 1, Interval: time.Hour, Storage: pgratelimit.Ephemeral})
	require.NoError(t, err)
	var allowedCost atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				cost := int64(1 + (w+i)%3)
				m, err := pgratelimit.AllowAll(ctx, small.Charge("k", cost), big.Charge("k", cost))
				if err != nil {
					t.Error(err)
					return
				}
				if m.Allowed {
					allowedCost.Add(cost)
				}
			}
		}()
	}
	wg.Wait()
	spent := allowedCost.Load()
	require.LessOrEqual(t, spent, int64(37))
	require.GreaterOrEqual(t, spent, int64(35), "every denial left less than the largest cost")
	a, err := small.Peek(ctx, "k")
	require.NoError(t, err)
	b, err := big.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 37-spent, a.Remaining)
	require.Equal(t, 100-spent, b.Remaining)
}

// Callers list the same two charges in opposite orders, mixed with AllowN on
// the same keys, through two pools (two app instances): no deadlock, exact
// counts.
func TestAllowAllOppositeOrdersNoDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSchemaPools(t, 2)
	var lims [2][2]*pgratelimit.Limiter
	for i, pool := range s {
		for j, prefix := range []string{"a", "b"} {
			l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: prefix, Capacity: 1000, Refill: 1, Interval: time.Hour})
			require.NoError(t, err)
			lims[i][j] = l
		}
	}
	var spentA, spentB atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls := lims[w%2]
			for i := range 10 {
				var err error
				var ok bool
				x := ls[0].Charge("x", 1)
				y := ls[1].Charge("y", 1)
				if (w+i)%3 == 2 { // AllowN of one of the two
					var r pgratelimit.Result
					r, err = ls[w%2].AllowN(ctx, []string{"x", "y"}[w%2], 1)
					if ok = r.Allowed; ok {
						[]*atomic.Int64{&spentA, &spentB}[w%2].Add(1)
					}
				} else {
					if (w+i)%3 == 1 {
						x, y = y, x // the opposite order
					}
					var m pgratelimit.MultiResult
					m, err = pgratelimit.AllowAll(ctx, x, y)
					if ok = m.Allowed; ok {
						spentA.Add(1)
						spentB.Add(1)
					}
				}
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				if !ok {
					t.Errorf("worker %d: denied with plenty of tokens", w)
				}
			}
		}()
	}
	wg.Wait()
	a, err := lims[0][0].Peek(ctx, "x")
	require.NoError(t, err)
	b, err := lims[0][1].Peek(ctx, "y")
	require.NoError(t, err)
	require.Equal(t, 1000-spentA.Load(), a.Remaining)
	require.Equal(t, 1000-spentB.Load(), b.Remaining)
}

// Bad input is refused before any database access, and nothing is written.
func TestAllowAllBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	a, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "a", Capacity: 5, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	b, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "b", Capacity: 10, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	other, err := newLimiterOn(newPool(t), pgratelimit.Config{Prefix: "a", Capacity: 5, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		charges []pgratelimit.Charge
		want    error
	}{
		{"no charges", nil, pgratelimit.ErrInvalidArgument},
		{"zero charge", []pgratelimit.Charge{a.Charge("k", 1), {}}, pgratelimit.ErrInvalidArgument},
		{"two pools", []pgratelimit.Charge{a.Charge("k", 1), other.Charge("k", 1)}, pgratelimit.ErrInvalidArgument},
		{"empty key", []pgratelimit.Charge{a.Charge("k", 1), b.Charge("", 1)}, pgratelimit.ErrInvalidKey},
		{"NUL in key", []pgratelimit.Charge{a.Charge("k\x00", 1)}, pgratelimit.ErrInvalidKey},
		{"long key", []pgratelimit.Charge{a.Charge(strings.Repeat("k", 1024+1), 1)}, pgratelimit.ErrInvalidKey},
		{"zero cost", []pgratelimit.Charge{a.Charge("k", 1), b.Charge("k", 0)}, pgratelimit.ErrInvalidCost},
		{"negative cost", []pgratelimit.Charge{a.Charge("k", -3)}, pgratelimit.ErrInvalidCost},
		{"over capacity", []pgratelimit.Charge{a.Charge("k", 6)}, pgratelimit.ErrCostExceedsCapacity},
		{"over capacity summed", []pgratelimit.Charge{a.Charge("k", 3), b.Charge("k", 1), a.Charge("k", 3)}, pgratelimit.ErrCostExceedsCapacity},
	} {
		_, err := pgratelimit.AllowAll(ctx, tc.charges...)
		require.ErrorIs(t, err, tc.want, tc.name)
		tx, terr := pool.Begin(ctx)
		require.NoError(t, terr)
		_, err = pgratelimit.PgxTx(tx).AllowAll(ctx, tc.charges...)
		require.ErrorIs(t, err, tc.want, tc.name+" (Tx)")
		require.NoError(t, tx.Rollback(ctx))
	}
	require.Zero(t, countRows(t, pool, "true"), "nothing written")
}

// Costs of one bucket that add up past int64 are ErrCostExceedsCapacity,
// before any database access (regression: the sum saturated at
// math.MaxInt64, which a Capacity of math.MaxInt64 allowed, and a row was
// written).
func TestAllowAllCostsPastInt64(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "huge", Capacity: math.MaxInt64, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	huge := l.Charge("k", math.MaxInt64)
	one := l.Charge("k", 1)
	for _, charges := range [][]pgratelimit.Charge{{huge, huge}, {huge, one}, {one, huge}} {
		_, err := pgratelimit.AllowAll(ctx, charges...)
		require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
		tx, terr := pool.Begin(ctx)
		require.NoError(t, terr)
		_, err = pgratelimit.PgxTx(tx).AllowAll(ctx, charges...)
		require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
		require.NoError(t, tx.Rollback(ctx))
	}
	require.Zero(t, countRows(t, pool, "true"), "nothing written")
	m, err := pgratelimit.AllowAll(ctx, huge)
	require.NoError(t, err)
	require.True(t, m.Allowed, "one charge of MaxInt64 fits a bucket of MaxInt64")
}

// The same bucket listed twice adds up; durable and ephemeral buckets of the
// same prefix and key are different buckets.
func TestAllowAllSameBucketTwiceAndMixedStorages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	durable, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 10, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	ephemeral, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 10, Refill: 1, Interval: time.Hour, Storage: pgratelimit.Ephemeral})
	require.NoError(t, err)
	m, err := pgratelimit.AllowAll(ctx,
		durable.Charge("k", 3),
		ephemeral.Charge("k", 1),
		durable.Charge("k", 4),
	)
	require.NoError(t, err)
	require.True(t, m.Allowed)
	require.Len(t, m.Results, 3)
	require.Equal(t, int64(3), m.Results[0].Remaining, "3+4 taken from one bucket")
	require.Equal(t, m.Results[0], m.Results[2])
	require.Equal(t, int64(9), m.Results[1].Remaining)
	d, err := durable.Peek(ctx, "k")
	require.NoError(t, err)
	e, err := ephemeral.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, [2]int64{3, 9}, [2]int64{d.Remaining, e.Remaining})

	m, err = pgratelimit.AllowAll(ctx, durable.Charge("k", 2), durable.Charge("k", 2))
	require.NoError(t, err)
	require.False(t, m.Allowed, "2+2 > 3")
	require.False(t, m.Results[0].Allowed)
	require.Equal(t, int64(3), m.Results[1].Remaining)
}

// Plans: limiters that share a Prefix share buckets. Moving a key to a bigger
// plan adds the difference of the capacities at once and refills up to the
// new capacity; back to the smaller one clamps.
func TestPlansShareBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	plans := map[string]*pgratelimit.Limiter{}
	for name, capacity := range map[string]int64{"free": 10, "pro": 600} {
		l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "api", Capacity: capacity, Refill: capacity, Interval: time.Minute, Clock: clock.Now})
		require.NoError(t, err)
		plans[name] = l
	}
	r, err := plans["free"].AllowN(ctx, "cust-1", 4)
	require.NoError(t, err)
	require.Equal(t, int64(6), r.Remaining)

	// Upgrade: 6 + 590, then the next refill fills to 600.
	r, err = plans["pro"].AllowN(ctx, "cust-1", 1)
	require.NoError(t, err)
	require.Equal(t, int64(595), r.Remaining, "the upgrade adds the difference")
	clock.Add(time.Minute)
	r, err = plans["pro"].AllowN(ctx, "cust-1", 100)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(500), r.Remaining, "refilled up to the new capacity")

	// Downgrade: clamped to 10.
	r, err = plans["free"].Peek(ctx, "cust-1")
	require.NoError(t, err)
	require.Equal(t, int64(10), r.Remaining, "the downgrade clamps")
	r, err = plans["free"].AllowN(ctx, "cust-1", 10)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = plans["free"].AllowN(ctx, "cust-1", 1)
	require.NoError(t, err)
	require.False(t, r.Allowed)
}

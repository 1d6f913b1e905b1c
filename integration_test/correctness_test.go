package integration

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// A row held by a long transaction stalls only the checks of that row: a
// check of another key is decided at once, with or without LockTimeout, and
// the waiting checks are decided in order when the row is released.
func TestHeldRowStallsOnlyItsKey(t *testing.T) {
	t.Parallel()
	for _, lockTimeout := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprintf("LockTimeout=%s", lockTimeout), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// Per check, each waiting check holds a connection: leave room.
			pool := testdb.NewSchema(t).Pool(t, 8)
			l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 3, Refill: 1, Interval: time.Hour, LockTimeout: lockTimeout})
			require.NoError(t, err)

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			r, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "locked", 1) // a new key: its row is inserted, uncommitted
			require.NoError(t, err)
			require.True(t, r.Allowed)

			var wg sync.WaitGroup
			results := make(chan error, 4)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					_, err := l.AllowN(c, "locked", 1)
					results <- err
				}()
			}
			time.Sleep(200 * time.Millisecond) // let them queue on the row

			for i := range 3 {
				c, cancel := context.WithTimeout(ctx, time.Second)
				r, err := l.AllowN(c, fmt.Sprintf("free-%d", i), 1)
				cancel()
				require.NoError(t, err, "a key nobody holds must not wait for another key's lock")
				require.True(t, r.Allowed)
			}
			r, err = l.Peek(ctx, "free-0")
			require.NoError(t, err)
			require.Equal(t, int64(2), r.Remaining)

			require.NoError(t, tx.Commit(ctx))
			wg.Wait()
			close(results)
			for err := range results {
				require.NoError(t, err)
			}
			r, err = l.Peek(ctx, "locked")
			require.NoError(t, err)
			require.Equal(t, int64(0), r.Remaining, "1 in the transaction, then 2 of the 4 waiting checks")
		})
	}
}

// With LockTimeout, a check of a held row fails with ErrLockTimeout (it
// waited for its own bucket), and spends nothing.
func TestLockTimeoutOnHeldRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 3, Refill: 1, Interval: time.Hour, LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // on a failure too: the schema's DROP would wait for it
	_, err = l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "locked", 1)
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "locked", 1)
	require.ErrorIs(t, err, pgratelimit.ErrLockTimeout)
	require.NoError(t, tx.Rollback(ctx))
	r, err := l.Peek(ctx, "locked")
	require.NoError(t, err)
	require.Equal(t, int64(3), r.Remaining)
}

// In the caller's transaction, a new key's refills are reckoned from the
// clock read after the row lock, not from when the transaction began.
func TestInTxGridStartsAtTheCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "g", Capacity: 1, Refill: 1, Interval: 2 * time.Second})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1`) // the transaction starts now()
	require.NoError(t, err)
	time.Sleep(1200 * time.Millisecond)
	var before, after time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
	r, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "new", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.NoError(t, tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after))
	// Refills fall on whole 2s since the epoch, reckoned from the check's
	// clock (not the transaction's start, 1.2s or more earlier): the bucket
	// is full again at the first of them after the check, so the check's
	// clock, that grid point less ResetAfter, lies between before and after
	// (to the millisecond, however long the check took).
	require.Positive(t, r.ResetAfter)
	require.LessOrEqual(t, r.ResetAfter, 2*time.Second)
	found := false
	for _, next := range []time.Time{before.Truncate(2 * time.Second).Add(2 * time.Second), after.Truncate(2 * time.Second).Add(2 * time.Second)} {
		at := next.Add(-r.ResetAfter)
		found = found || !at.Before(before.Add(-time.Millisecond)) && !at.After(after.Add(time.Millisecond))
	}
	require.True(t, found, "ResetAfter %s: the check's clock is not between %s and %s", r.ResetAfter, before, after)
	require.NoError(t, tx.Commit(ctx))
}

// A check that gives up before its batch decides leaves no trace: the key
// then answers exactly as a key never checked.
func TestGivenUpCheckLeavesNoTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "t", Capacity: 2, Refill: 1, Interval: 10 * time.Second, Clock: clock.Now})
	require.NoError(t, err)

	dead, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.AllowN(dead, "ghost", 1)
	require.ErrorIs(t, err, context.Canceled)

	clock.Add(5 * time.Second)
	for _, key := range []string{"ghost", "never"} {
		r, err := l.AllowN(ctx, key, 2)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	// Both answer alike at every step: the refill at 10s, and nothing more
	// until 20s.
	for _, step := range []time.Duration{4 * time.Second, 0, 5 * time.Second, time.Second} {
		clock.Add(step)
		var got []pgratelimit.Result
		for _, key := range []string{"ghost", "never"} {
			r, err := l.AllowN(ctx, key, 1)
			require.NoError(t, err)
			got = append(got, r)
		}
		require.Equal(t, got[0], got[1], "ghost and never at +%s", clock.Now().Sub(t0))
	}
}

// WaitN whose tokens arrive before its deadline succeeds, whatever its
// jitter.
func TestWaitNJustBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(t, pgratelimit.Config{Prefix: "w", Capacity: 1, Refill: 1, Interval: time.Second})
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", i)
			r, err := l.Allow(ctx, key)
			if err != nil || !r.Allowed {
				errs <- fmt.Errorf("first: %v %+v", err, r)
				return
			}
			// The token comes back within 1s; the deadline is 200ms after,
			// time for the retry even under -race on a busy machine. (That
			// jitter never eats the slack is TestMaxJitter's.)
			c, cancel := context.WithTimeout(ctx, time.Second+200*time.Millisecond)
			defer cancel()
			if _, err := l.Wait(c, key); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// Concurrent checks of one key through several limiters of one pool are
// decided in arrival order per caller: each goroutine's own sequence of
// results never goes up without a refill.
func TestPerKeyOrderUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "o", Capacity: 1000, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	var mu sync.Mutex
	var remaining []int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := int64(1 << 62)
			for range 20 {
				r, err := l.AllowN(ctx, "hot", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Remaining >= last {
					t.Errorf("remaining went from %d to %d", last, r.Remaining)
				}
				last = r.Remaining
				mu.Lock()
				remaining = append(remaining, r.Remaining)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(remaining, func(i, j int) bool { return remaining[i] < remaining[j] })
	for i, r := range remaining {
		require.Equal(t, int64(1000-320+i), r, "every check saw a distinct bucket state")
	}
}

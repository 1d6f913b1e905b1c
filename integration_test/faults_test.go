package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// lateness is how long after its deadline a call may come back and still be
// said to have honoured it: generous, for a busy machine under -race; a call
// that waits for the database instead of its deadline waits until the test
// lets it go, far longer.
const lateness = 10 * time.Second

// load runs checks from workers goroutines until stop is closed, each with
// its own deadline, and records what came back.
type load struct {
	allowed, denied, errs, overdue atomic.Int64
	okAfter                        atomic.Int64 // successes after mark was set
	mark                           atomic.Bool
	worst                          atomic.Int64 // longest call, ns
}

func (ld *load) run(l *pgratelimit.Limiter, workers int, key string, deadline time.Duration, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				r, err := l.Allow(ctx, key)
				took := time.Since(start)
				cancel()
				if d := int64(took); d > ld.worst.Load() {
					ld.worst.Store(d)
				}
				if took > deadline+lateness {
					ld.overdue.Add(1)
				}
				switch {
				case err != nil:
					ld.errs.Add(1)
					time.Sleep(10 * time.Millisecond)
				case r.Allowed:
					ld.allowed.Add(1)
				default:
					ld.denied.Add(1)
				}
				if err == nil && ld.mark.Load() {
					ld.okAfter.Add(1)
				}
			}
		}()
	}
	return &wg
}

// PostgreSQL restarted under load: calls end within their deadlines, checks
// work again afterwards without restarting anything, and the durable bucket
// never gives out more than it holds.
func TestRestartUnderLoad(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			in := testdb.NewCluster(t, pglaunch.Options{})
			pool := clusterPool(t, in, 40)
			const capacity = 3000
			l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "r", Capacity: capacity, Refill: 1, Interval: time.Hour})
			require.NoError(t, err)

			var ld load
			stop := make(chan struct{})
			wg := ld.run(l, 32, "k", 2*time.Second, stop)
			time.Sleep(500 * time.Millisecond)
			before := ld.allowed.Load() + ld.denied.Load()
			require.NoError(t, in.Restart(context.Background(), mode))
			ld.mark.Store(true)
			require.Eventually(t, func() bool { return ld.okAfter.Load() > 100 }, 30*time.Second, 10*time.Millisecond,
				"checks succeed again after the restart")
			close(stop)
			wg.Wait()

			require.Positive(t, before, "checks ran before the restart")
			require.Zero(t, ld.overdue.Load(), "a call ran past its deadline (longest %s)", time.Duration(ld.worst.Load()))
			require.LessOrEqual(t, ld.allowed.Load(), int64(capacity), "over-admission across the restart")
			r, err := l.Peek(context.Background(), "k")
			require.NoError(t, err)
			spent := capacity - r.Remaining
			require.GreaterOrEqual(t, spent, ld.allowed.Load(), "every allowed check was spent (and kept) by the database")
			t.Logf("%s: %d allowed, %d denied, %d errors; %d tokens spent; longest call %s",
				mode, ld.allowed.Load(), ld.denied.Load(), ld.errs.Load(), spent, time.Duration(ld.worst.Load()).Round(time.Millisecond))
		})
	}
}

// After an immediate shutdown (a crash, to PostgreSQL) the ephemeral table
// comes back empty, so every bucket is full again; the durable one keeps
// its state.
func TestEphemeralAfterCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := testdb.NewCluster(t, pglaunch.Options{})
	pool := clusterPool(t, in, 4)
	var ls []*pgratelimit.Limiter
	for _, st := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "c", Capacity: 5, Refill: 1, Interval: time.Hour, Storage: st})
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		ls = append(ls, l)
	}
	require.NoError(t, in.Restart(ctx, "immediate"))
	pool.Reset() // drop the dead connections
	durable, err := ls[0].Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(0), durable.Remaining, "durable: state survives")
	ephemeral, err := ls[1].Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(5), ephemeral.Remaining, "ephemeral: truncated by crash recovery, full again")
}

// A backend terminated mid-transaction: the check returns an error, the
// transaction rolled back, nothing spent; the pool carries on.
func TestBackendTerminated(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "it finds the blocked backend with pg_blocking_pids, which on Citus sees only the coordinator's locks, not the workers'")
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "t", Capacity: 10, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "k")
	require.NoError(t, err)

	// A check blocked on the row lock, inside its transaction.
	holder := lockRow(t, pool, "t", "k")
	done := make(chan error)
	go func() {
		_, err := l.AllowN(ctx, "k", 4)
		done <- err
	}()
	var holderPid, pid int
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPid))
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holderPid).Scan(&pid)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the check waits on the holder's row lock")
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.Error(t, err)
		require.False(t, errors.Is(err, pgratelimit.ErrInvalidKey))
	case <-time.After(10 * time.Second):
		t.Fatal("the check did not return after its backend was terminated")
	}
	require.NoError(t, holder.Rollback(ctx))

	// In the caller's transaction: terminated before commit, nothing spent.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	r, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	var txPid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&txPid))
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, txPid)
	require.NoError(t, err)
	require.Error(t, tx.Commit(ctx))

	r, err = l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(9), r.Remaining, "only the first check's token is spent")
	r, err = l.Allow(ctx, "k")
	require.NoError(t, err, "the pool replaced the dead connections")
	require.True(t, r.Allowed)
}

// Checks whose deadlines pass while their transaction (or batch) waits on a
// locked row return their context's error in time; the others get their
// results; no check is reported allowed without its tokens being spent.
func TestDeadlinesWhileBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewSchema(t).Pool(t, 8)
	const capacity = 1000
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "d", Capacity: capacity, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	for _, k := range []string{"free", "locked"} {
		_, err := l.Allow(ctx, k)
		require.NoError(t, err)
	}
	holder := lockRow(t, pool, "d", "locked")

	var allowed [2]atomic.Int64
	var late, timedOut atomic.Int64
	var wg sync.WaitGroup
	for w := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, key := w%2, []string{"free", "locked"}[w%2]
			for range 5 {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				start := time.Now()
				r, err := l.Allow(cctx, key)
				cancel()
				if time.Since(start) > 300*time.Millisecond+lateness {
					late.Add(1)
				}
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
				case err != nil:
					// The batch's own deadline can fire a hair before the
					// caller's: the driver reports it in its own words.
					timedOut.Add(1)
				case r.Allowed:
					allowed[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, holder.Rollback(ctx))
	require.Zero(t, late.Load(), "a check returned long after its deadline")
	require.Positive(t, timedOut.Load(), "checks of the locked key timed out")

	for k, key := range []string{"free", "locked"} {
		r, err := l.Peek(ctx, key)
		require.NoError(t, err)
		spent := capacity - 1 - r.Remaining
		require.GreaterOrEqual(t, spent, allowed[k].Load(), "%s: reported allowed without being spent", key)
	}
	t.Logf("allowed free=%d locked=%d; %d timed out", allowed[0].Load(), allowed[1].Load(), timedOut.Load())
}

// More goroutines than connections, short deadlines, a blocked key: every
// call comes back (an error, not a hang).
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewSchema(t).Pool(t, 2)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "p", Capacity: 100, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	holder := lockRow(t, pool, "p", "k")

	var errs, late atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			if _, err := l.Allow(cctx, "k"); err != nil {
				errs.Add(1)
			}
			if time.Since(start) > 200*time.Millisecond+lateness {
				late.Add(1)
			}
		}()
	}
	wg.Wait()
	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, int64(50), errs.Load(), "every check against the blocked key failed")
	require.Zero(t, late.Load(), "a check hung past its deadline")
	r, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(98), r.Remaining, "nothing was spent by the failed checks")
}

package integration

// Asynchronous commit (Config.AsyncCommit, issue #35): applied to the
// limiter's own transactions as the server sees them, never mixed with
// synchronous ones in a batch, refused with money, and what a crash of the
// server loses in each mode.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// Each transaction that writes a bucket logs the synchronous_commit the
// server runs it with (a trigger): off for an asynchronous limiter's own
// transactions, on for a synchronous one's, also when both kinds arrive at
// once (batches never mix them), on for an AllowAll with a synchronous
// charge, and the caller's in the caller's transaction.
func TestCommitModeAsTheServerSeesIt(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "Citus does not take triggers on distributed tables")
	ctx := context.Background()
	pool := newPool(t)
	for _, ddl := range []string{
		`CREATE TABLE commit_log (prefix text, mode text)`,
		`CREATE FUNCTION log_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO commit_log VALUES (NEW.prefix, current_setting('synchronous_commit')); RETURN NEW; END $$`,
		`CREATE TRIGGER log_commit BEFORE UPDATE ON pgratelimit_buckets FOR EACH ROW EXECUTE FUNCTION log_commit()`,
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	mk := func(prefix string, async bool) *pgratelimit.Limiter {
		l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: prefix, Capacity: 1_000_000, Refill: 1, Interval: time.Hour, AsyncCommit: async})
		require.NoError(t, err)
		return l
	}
	async, sync_ := mk("async", true), mk("sync", false)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 20 {
				l := async
				if (w+i)%2 == 0 {
					l = sync_
				}
				_, err := l.Allow(ctx, fmt.Sprint("k", i%4))
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	_, err := pgratelimit.AllowAll(ctx, async.Charge("both", 1), sync_.Charge("both", 1))
	require.NoError(t, err)
	_, err = pgratelimit.AllowAll(ctx, async.Charge("both", 1), sync_.Charge("both", 1))
	require.NoError(t, err) // the second writes both rows: logged
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = local`)
	require.NoError(t, err)
	_, err = async.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "caller", 1)
	require.NoError(t, err)
	_, err = async.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "caller", 1)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	rows, err := pool.Query(ctx, `SELECT prefix, mode, count(*) FROM commit_log GROUP BY 1, 2 ORDER BY 1, 2`)
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var prefix, mode string
		var n int
		require.NoError(t, rows.Scan(&prefix, &mode, &n))
		got[prefix+" "+mode] = n
	}
	require.NoError(t, rows.Err())
	require.Positive(t, got["async off"])
	require.Positive(t, got["sync on"])
	require.Equal(t, 2, got["async on"], "only the two AllowAlls with a synchronous charge: %v", got)
	require.Zero(t, got["sync off"], "a synchronous limiter's transaction was asynchronous: %v", got)
	require.Equal(t, 2, got["async local"], "the caller's transaction keeps the caller's setting: %v", got)
}

// Money never commits asynchronously: a limiter with Grants or Ledger
// refuses AsyncCommit, and a call with a request ID on an asynchronous
// limiter is refused.
func TestAsyncCommitRefusedForMoney(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	for _, cfg := range []pgratelimit.Config{
		{Prefix: "m", Capacity: 10, Refill: 1, Interval: time.Hour, AsyncCommit: true, Grants: true},
		{Prefix: "m", Capacity: 10, Refill: 1, Interval: time.Hour, AsyncCommit: true, Ledger: true},
	} {
		_, err := pgratelimit.New(pool, cfg)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	}
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "m", Capacity: 10, Refill: 1, Interval: time.Hour, AsyncCommit: true})
	require.NoError(t, err)
	idCtx := pgratelimit.WithRequestID(ctx, "r1")
	_, err = l.AllowN(idCtx, "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	_, err = l.Debit(idCtx, "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	_, err = l.Settle(ctx, "k", "r1", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	r, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(10), r.Remaining, "nothing was charged")
}

// What a crash of the server (an immediate shutdown) under load loses: an
// asynchronous limiter at most the checks acknowledged in the last moments
// (the documented window: three times wal_writer_delay, here with a margin),
// a synchronous one none.
func TestAsyncCommitCrash(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "it crashes a cluster of its own")
	ctx := context.Background()
	in := testdb.NewCluster(t, pglaunch.Options{})
	pool := clusterPool(t, in, 16)
	const window = 3*200*time.Millisecond + 400*time.Millisecond // wal_writer_delay 200ms, and a margin
	for _, async := range []bool{true, false} {
		prefix := fmt.Sprint("crash-", async)
		l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: prefix, Capacity: 1 << 40, Refill: 1, Interval: 24 * time.Hour, AsyncCommit: async})
		require.NoError(t, err)
		var (
			mu    sync.Mutex
			acked []time.Time
			stop  atomic.Bool
			wg    sync.WaitGroup
		)
		for range 16 {
			wg.Go(func() {
				for !stop.Load() {
					cctx, cancel := context.WithTimeout(ctx, time.Second)
					r, err := l.Allow(cctx, "k")
					cancel()
					if err == nil && r.Allowed {
						mu.Lock()
						acked = append(acked, time.Now())
						mu.Unlock()
					}
				}
			})
		}
		time.Sleep(1500 * time.Millisecond)
		crashed := time.Now()
		require.NoError(t, in.Restart(ctx, "immediate"))
		stop.Store(true)
		wg.Wait()
		pool.Reset()
		r, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		kept := int64(1<<40) - r.Remaining
		late := 0
		for _, at := range acked {
			if crashed.Sub(at) < window {
				late++
			}
		}
		lost := int64(len(acked)) - kept
		t.Logf("async %v: %d acknowledged, %d kept, %d lost (%d in the last %v)", async, len(acked), kept, lost, late, window)
		require.NotEmpty(t, acked)
		if async {
			require.LessOrEqual(t, lost, int64(late), "lost more than the checks of the window")
		} else {
			require.LessOrEqual(t, lost, int64(0), "a synchronous check was lost")
		}
	}
}

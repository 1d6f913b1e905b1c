package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/cleanup"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// Deleting expired rows never changes a decision: the same checks against a
// schema that is cleaned and one that is not give the same results.
func TestCleanupNeverChangesADecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	var pools [2]*pgxpool.Pool
	var limiters [2][2]*pgratelimit.Limiter // [cleaned?][storage]
	for i := range pools {
		pools[i] = newPool(t)
		for s, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
			l, err := newLimiterOn(pools[i], pgratelimit.Config{
				Prefix: "same", Capacity: 7, Refill: 2, Interval: 10 * time.Second, Storage: storage, Clock: clock.Now,
			})
			require.NoError(t, err)
			limiters[i][s] = l
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var deleted int64
	for step := range 600 {
		if step%20 == 0 {
			// Now and then a long pause, past most rows' expiry.
			clock.Add(time.Duration(rng.IntN(200)) * time.Second)
			n, err := deleteExpired(ctx, pools[1], pgratelimit.CleanerConfig{Clock: clock.Now, BatchSize: 3})
			require.NoError(t, err)
			deleted += n
		}
		clock.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
		key := fmt.Sprintf("k%d", rng.IntN(8))
		s := rng.IntN(2)
		var got [2]pgratelimit.Result
		if rng.IntN(4) == 0 {
			for i := range got {
				r, err := limiters[i][s].Peek(ctx, key)
				require.NoError(t, err)
				got[i] = r
			}
		} else {
			cost := 1 + rng.Int64N(7)
			for i := range got {
				r, err := limiters[i][s].AllowN(ctx, key, cost)
				require.NoError(t, err)
				got[i] = r
			}
		}
		require.Equal(t, got[0], got[1], "step %d, key %s", step, key)
	}
	require.Positive(t, deleted, "cleanup deleted rows along the way")
	t.Logf("%d rows deleted by cleanups between the checks", deleted)
}

// warpClock runs a hundred times faster than real time.
type warpClock struct{ start time.Time }

func (w warpClock) Now() time.Time { return t0.Add(100 * time.Since(w.start)) }

// Cleanup running in a loop under load: no errors, and no key gets more than
// its bucket allows.
func TestCleanupUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewSchema(t).Pool(t, 24)
	clock := warpClock{start: time.Now()}
	const capacity, refill, interval = 2, 1, time.Minute
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "load", Capacity: capacity, Refill: refill, Interval: interval, Clock: clock.Now})
	require.NoError(t, err)

	const keys, workers = 1000, 32
	// The load runs for runFor and until cleanup has run three times, at
	// most a minute.
	runFor := 4 * time.Second
	var allowed [keys]atomic.Int64
	var checks, cleaned, cleanups atomic.Int64
	stop := make(chan struct{})
	var cleanerWG sync.WaitGroup
	cleanerWG.Add(1)
	go func() {
		defer cleanerWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now, BatchSize: 50})
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			cleaned.Add(n)
			cleanups.Add(1)
		}
	}()
	var wg sync.WaitGroup
	started := time.Now()
	running := func() bool {
		return time.Since(started) < runFor || (cleanups.Load() < 3 && time.Since(started) < time.Minute)
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				// A window of 100 keys slides over the 1000, so keys go idle,
				// expire, get deleted and come back.
				window := int(time.Since(clock.start) / (runFor / 10))
				k := (window*100 + rand.IntN(100)) % keys
				r, err := l.Allow(ctx, fmt.Sprintf("key-%d", k))
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				checks.Add(1)
				if r.Allowed {
					allowed[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	cleanerWG.Wait()

	elapsed := clock.Now().Sub(t0)
	bound := capacity + refill*int64(elapsed/interval)
	var total int64
	for k := range allowed {
		n := allowed[k].Load()
		total += n
		require.LessOrEqual(t, n, bound, "key %d allowed %d in %s of warped time", k, n, elapsed)
	}
	require.Positive(t, cleaned.Load(), "cleanup deleted rows during the load")
	t.Logf("%d checks, %d allowed, %d rows cleaned, per-key bound %d", checks.Load(), total, cleaned.Load(), bound)
}

// 200,000 expired rows go in batches while checks run; the slowest check
// is reported.
func TestCleanupLargeBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewSchema(t).Pool(t, 12)
	insertExpired(t, pool, 200000)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "live", Capacity: 1 << 40, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	old, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "old", Capacity: 5, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)

	done := make(chan struct{})
	var wg sync.WaitGroup
	var slowest atomic.Int64
	var checks atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				// Half the checks hit keys that are being deleted.
				lim, key := l, fmt.Sprintf("live-%d", i%100)
				if w%2 == 0 {
					lim, key = old, fmt.Sprintf("k%d", 1+rand.IntN(200000))
				}
				if _, err := lim.Allow(ctx, key); err != nil {
					t.Errorf("check during cleanup: %v", err)
					return
				}
				checks.Add(1)
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
			}
		}()
	}
	start := time.Now()
	n, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{})
	took := time.Since(start)
	close(done)
	wg.Wait()
	require.NoError(t, err)
	// Rows that the checks re-created are live and stay.
	require.Zero(t, countRows(t, pool, `expires_at <= now()`))
	require.InDelta(t, 200000, n, float64(checks.Load()), "every expired row went, less those checks took first")
	t.Logf("deleted %d rows in %s (%.0f rows/s) while %d checks ran; slowest check %s",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), checks.Load(), time.Duration(slowest.Load()).Round(time.Microsecond))
}

// Two Cleaners at once: both run without error, and each row is deleted once.
func TestTwoCleaners(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	insertExpired(t, pool, 20000)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var stats []int64
	var wg sync.WaitGroup
	for range 2 {
		c, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{BatchSize: 500})
		require.NoError(t, err)
		// What Run does at each interval, with the stats kept: a Cleaner
		// that finds the other holding the lock ends its run; the other
		// goes on.
		wg.Go(func() {
			for ctx.Err() == nil {
				st, err := c.RunOnce(ctx)
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("RunOnce: %v", err)
					return
				}
				mu.Lock()
				stats = append(stats, st)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	// Wait until the rows are gone, both have run, and the runs have
	// reported every deletion: cancelling while a batch's COMMIT is
	// answered would lose its count (the rows are gone, the reply is not
	// read), which is not what this test is about.
	sum := func() (n int64) {
		for _, d := range stats {
			n += d
		}
		return n
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(stats) >= 4 && sum() >= 20000 && countRows(t, pool, `true`) == 0
	}, time.Minute, 10*time.Millisecond)
	cancel()
	wg.Wait()
	require.Equal(t, int64(20000), sum(), "each row deleted once")
	require.Zero(t, countRows(t, pool, `true`))
}

// Cancelling Run's context stops it promptly, also in the middle of a run.
func TestCleanerStopsOnCancel(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	insertExpired(t, pool, 50000)
	c, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{BatchSize: 10, Interval: time.Hour})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	ret := make(chan error)
	go func() { ret <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return countRows(t, pool, `true`) < 50000 }, time.Minute, time.Millisecond,
		"the first run starts right away")
	cancel() // mid-run: 50,000 rows at 10 a batch take far longer than this test
	select {
	case err := <-ret:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	require.Positive(t, countRows(t, pool, `true`), "it stopped before finishing")
}

func TestCleanupBadOptions(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	_, err := deleteExpired(context.Background(), pool, pgratelimit.CleanerConfig{BatchSize: -1})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = deleteExpired(context.Background(), nil, pgratelimit.CleanerConfig{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{Interval: -time.Second})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{StatementTimeout: -time.Second})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// RunOnce reports the rows it deleted; a run while another instance holds
// the schema's cleanup lock deletes nothing and reports 0.
func TestCleanerRunOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	insertExpired(t, pool, 2000)
	c, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{BatchSize: 100})
	require.NoError(t, err)

	// The lock is taken where a batch runs: on the database, or on Citus
	// on the node of each batch's shards (docs/citus.md).
	var holders []pgx.Tx
	for _, db := range cleanupLockNodes(t, pool) {
		holder, err := db.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }() // on a failure too: the pool's Close waits for it
		_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, cleanup.LockClass)
		require.NoError(t, err)
		holders = append(holders, holder)
	}
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "another instance holds the lock: this one skips")
	require.Equal(t, int64(2000), countRows(t, pool, "true"), "nothing deleted")
	for _, holder := range holders {
		require.NoError(t, holder.Rollback(ctx))
	}

	n, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2000), n)
}

// cleanupLockNodes are the databases where a cleaner of pool's schema takes
// its advisory lock: pool's own, or on distributed tables each node that
// holds shards (pool's configuration, on the node's address).
func cleanupLockNodes(t *testing.T, pool *pgxpool.Pool) []*pgxpool.Pool {
	t.Helper()
	if os.Getenv(testdb.DistributeEnvVar) == "" {
		return []*pgxpool.Pool{pool}
	}
	rows, err := pool.Query(context.Background(), `SELECT nodename, nodeport FROM pg_dist_node
WHERE isactive AND noderole = 'primary' AND shouldhaveshards`)
	require.NoError(t, err)
	type node struct {
		Host string
		Port int
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[node])
	require.NoError(t, err)
	var out []*pgxpool.Pool
	for _, n := range nodes {
		cfg := pool.Config().Copy()
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = n.Host, uint16(n.Port)
		cfg.ConnConfig.Fallbacks = nil
		np, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(np.Close)
		out = append(out, np)
	}
	return out
}

// A check of a key idle past its expiry moves expires_at, and its update is
// still HOT: no index covers expires_at (cleanup walks the table instead), so
// a table of many rarely checked keys does not write index entries per check.
func TestIdleKeysUpdateInPlace(t *testing.T) {
	t.Parallel()
	if os.Getenv(testdb.DistributeEnvVar) != "" {
		t.Skip("on Citus the statistics are the workers' shards'; TestCitusRouting covers the checks")
	}
	ctx := context.Background()
	pool := newPool(t)
	insertExpired(t, pool, 1000) // prefix "old", keys k1..k1000, expired an hour ago
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "old", Capacity: 10, Refill: 1, Interval: time.Minute})
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range 100 { // every tenth row: a page has room for a few new versions, not for a hundred
		r, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, fmt.Sprintf("k%d", 1+10*i), 1)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, int64(9), r.Remaining, "an expired row reads as a full bucket")
	}
	var upd, hot int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
WHERE relid = 'pgratelimit_buckets'::regclass`).Scan(&upd, &hot))
	require.Equal(t, int64(100), upd)
	require.Equal(t, upd, hot, "every update HOT")
	rows, err := tx.Query(ctx, `SELECT indexname FROM pg_indexes WHERE tablename IN ('pgratelimit_buckets', 'pgratelimit_ephemeral_buckets') AND schemaname = current_schema() ORDER BY 1`)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"pgratelimit_buckets_pkey", "pgratelimit_ephemeral_buckets_pkey"}, indexes, "only the primary keys")
}

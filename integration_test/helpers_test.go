package integration

// Helpers shared by the integration tests.

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// fakeClock is a settable Config.Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// t0 is a whole minute, so expiry rounding (to the minute) falls predictably.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func newClock() *fakeClock { return &fakeClock{t: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t0.Add(d)
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newLimiter is a limiter on a fresh schema.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testdb.Pool(t)
}

func newLimiter(t *testing.T, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	l, err := newLimiterOn(testdb.Pool(t), cfg)
	require.NoError(t, err)
	return l
}

// perCheck says the suite runs with coalescing off (see modes).
var perCheck bool

// newLimiterOn is pgratelimit.New in the suite's mode.
func newLimiterOn(pool *pgxpool.Pool, cfg pgratelimit.Config) (*pgratelimit.Limiter, error) {
	cfg.DisableCoalescing = cfg.DisableCoalescing || perCheck
	return pgratelimit.New(pool, cfg)
}

// lockRow holds a bucket's row locked, as a long transaction would, until
// the returned transaction ends.
func lockRow(t *testing.T, pool *pgxpool.Pool, prefix, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgratelimit_buckets WHERE prefix = $1 AND key = $2 FOR UPDATE`, prefix, key)
	require.NoError(t, err)
	return tx
}

func countRows(t *testing.T, pool *pgxpool.Pool, where string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM pgratelimit_buckets WHERE `+where+`) + (SELECT count(*) FROM pgratelimit_ephemeral_buckets WHERE `+where+`)`).Scan(&n))
	return n
}

// insertExpired puts n expired rows in the durable table.
func insertExpired(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO pgratelimit_buckets (prefix, key, tokens, refilled_at, expires_at)
SELECT 'old', 'k' || i, 1, now() - interval '2 hours', now() - interval '1 hour' FROM generate_series(1, $1) i`, n)
	require.NoError(t, err)
}

// hammer runs attempts checks from workers goroutines, spread over limiters,
// and returns the cost allowed and the errors seen.
func hammer(t *testing.T, limiters []*pgratelimit.Limiter, workers, attempts int, key string, cost func() int64) (allowedCost, allowedChecks int64) {
	t.Helper()
	ctx := context.Background()
	var next, cost64, checks atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := limiters[w%len(limiters)]
			for next.Add(1) <= int64(attempts) {
				c := cost()
				r, err := l.AllowN(ctx, key, c)
				if err != nil {
					errs <- err
					return
				}
				if r.Allowed {
					cost64.Add(c)
					checks.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("check failed: %v", err)
	}
	return cost64.Load(), checks.Load()
}

// unreachablePool is a pool whose every connection attempt fails, so any
// input that reached the database would come back as a connection error
// instead of the typed error the tests expect.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// skipOnDistributed skips a test of single-server behaviour when the suite
// runs on distributed tables (PGRATELIMIT_TEST_DISTRIBUTE, Citus).
func skipOnDistributed(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(testdb.DistributeEnvVar) != "" {
		t.Skip("not on distributed tables: " + why)
	}
}

// clusterPool is a pool on a cluster of the test's own.
func clusterPool(t *testing.T, in *pglaunch.Instance, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(in.URL + "&connect_timeout=2")
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newClient is pgratelimit.NewClient on pool, failing the test on an error.
func newClient(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.ClientConfig) *pgratelimit.Client {
	t.Helper()
	c, err := pgratelimit.NewClient(context.Background(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// clientLimiter is Client.NewLimiter in the suite's mode.
func clientLimiter(t *testing.T, c *pgratelimit.Client, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	cfg.DisableCoalescing = cfg.DisableCoalescing || perCheck
	l, err := c.NewLimiter(cfg)
	require.NoError(t, err)
	return l
}

// holderID is the ID of the backend that runs tx, as blockedBy takes it:
// its process ID, or on distributed tables its Citus global process ID
// (the row locks it holds are on the nodes).
func holderID(t *testing.T, tx pgx.Tx) int64 {
	t.Helper()
	q := `SELECT pg_backend_pid()`
	if os.Getenv(testdb.DistributeEnvVar) != "" {
		q = `SELECT citus_backend_gpid()`
	}
	var id int64
	require.NoError(t, tx.QueryRow(context.Background(), q).Scan(&id))
	return id
}

// blockedBy counts the backends waiting for a lock that the backend id
// (holderID) holds.
func blockedBy(t *testing.T, pool *pgxpool.Pool, id int64) int {
	t.Helper()
	q := `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`
	if os.Getenv(testdb.DistributeEnvVar) != "" {
		q = `SELECT count(*) FROM citus_lock_waits WHERE blocking_gpid = $1`
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), q, id).Scan(&n))
	return n
}

// newSchemaPools opens n pools on one fresh schema (n app instances).
func newSchemaPools(t *testing.T, n int) []*pgxpool.Pool {
	s := testdb.NewSchema(t)
	var pools []*pgxpool.Pool
	for range n {
		pools = append(pools, s.Pool(t, 0))
	}
	return pools
}

// pgbouncerPool is a pool of 32 connections through a PgBouncer of the
// test's own in transaction mode (exec query mode, as PgBouncer 1.18 needs).
func pgbouncerPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.PgBouncer(t) + "&default_query_exec_mode=exec")
	require.NoError(t, err)
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// deleteExpired runs one cleanup of pool's schema with cfg (NewCleaner,
// RunOnce) and returns the rows it deleted.
func deleteExpired(ctx context.Context, pool *pgxpool.Pool, cfg pgratelimit.CleanerConfig) (int64, error) {
	c, err := pgratelimit.NewCleaner(pool, cfg)
	if err != nil {
		return 0, err
	}
	return c.RunOnce(ctx)
}

// Package integration tests pgratelimit against a real PostgreSQL (see
// internal/testdb for where it comes from).
package integration

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/integration_test/dockerdb"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	testdb.Container = dockerdb.Start
	testdb.Main(m)
}

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

// perCheck is set by PGRATELIMIT_TEST_MODE=per-check: the suite then runs
// with coalescing off. make test runs it both ways.
var perCheck = os.Getenv("PGRATELIMIT_TEST_MODE") == "per-check"

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

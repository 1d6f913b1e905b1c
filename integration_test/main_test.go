// Package integration tests pgratelimit against a real PostgreSQL (see
// internal/testdb for where it comes from).
package integration

import (
	"context"
	"fmt"
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
	testdb.Main(modes{m})
}

// modes runs the suite once per coalescing mode, as River's driver suite
// runs once per driver: coalescing (the default) and per-check
// (Config.DisableCoalescing). PGRATELIMIT_TEST_MODE=coalesce or per-check
// runs one of them.
type modes struct{ m *testing.M }

func (ms modes) Run() int {
	code := 0
	for _, mode := range []string{"coalesce", "per-check"} {
		if want := os.Getenv("PGRATELIMIT_TEST_MODE"); want != "" && want != mode {
			continue
		}
		fmt.Printf("pgratelimit integration suite: %s\n", mode)
		perCheck = mode == "per-check"
		if c := ms.m.Run(); c != 0 {
			code = c
		}
	}
	return code
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

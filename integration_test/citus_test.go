package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// CitusEnvVar names the variable holding the URL of a Citus coordinator's
// database, with workers added. The tests create (and drop) schemas of their
// own there, with the bucket tables distributed by key.
const citusEnvVar = "PGRATELIMIT_TEST_CITUS_URL"

// citusPool is a pool on a fresh schema of the Citus cluster, migrated and
// distributed.
func citusPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv(citusEnvVar)
	if url == "" {
		t.Skipf("no Citus cluster: set %s to a coordinator's URL (Citus is not in Debian's packages; "+
			"README, Testing, says how to build one and start a coordinator and two workers)", citusEnvVar)
	}
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "citus_test_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Errorf("dropping %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping %s: %v", schema, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	defer db.Close()
	require.NoError(t, migrations.Up(ctx, db))
	require.NoError(t, migrations.Distribute(ctx, db))
	require.NoError(t, migrations.Distribute(ctx, db), "distributing again is a no-op")
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_dist_partition WHERE logicalrelid IN ('pgratelimit_buckets'::regclass, 'pgratelimit_ephemeral_buckets'::regclass)`).Scan(&n))
	require.Equal(t, 2, n)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Distribute on a plain PostgreSQL says that Citus is missing.
func TestDistributeWithoutCitus(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "the suite's database is a Citus coordinator")
	s := newSchemaPools(t, 1)[0]
	err := migrations.Distribute(context.Background(), stdlib.OpenDBFromPool(s))
	require.ErrorIs(t, err, migrations.ErrNoCitus)
}

// 16 concurrent checks of capacity 5 on one key allow exactly 5, in both
// modes and both storages, on Citus; and many keys are exact too.
func TestCitusExact(t *testing.T) {
	t.Parallel()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		for _, perCheck := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/per-check=%v", storage, perCheck), func(t *testing.T) {
				pool := citusPool(t, 32)
				l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "c", Capacity: 5, Refill: 1, Interval: time.Hour, Storage: storage, DisableCoalescing: perCheck})
				require.NoError(t, err)
				for trial := range 5 {
					key := fmt.Sprintf("hot-%d", trial)
					allowed := concurrently(t, 16, 1, func(int, int) string { return key }, l)
					require.Equal(t, int64(5), allowed, "trial %d", trial)
				}

				// Many keys: 400 checks over 20 keys of capacity 5.
				allowed := concurrently(t, 16, 25, func(w, i int) string { return fmt.Sprintf("k%d", (w*25+i)%20) }, l)
				require.Equal(t, int64(100), allowed)
			})
		}
	}
}

// AllowAll across shards and storages is exact and never deadlocks, in the
// limiter's transaction and in the caller's.
func TestCitusAllowAll(t *testing.T) {
	t.Parallel()
	pool := citusPool(t, 32)
	ctx := context.Background()
	user, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "user", Capacity: 30, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	org, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "org", Capacity: 100, Refill: 1, Interval: time.Hour, Storage: pgratelimit.Ephemeral})
	require.NoError(t, err)
	var spent atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				cs := []pgratelimit.Charge{user.Charge("u1", 1), org.Charge("o1", 1)}
				if (w+i)%2 == 1 {
					cs[0], cs[1] = cs[1], cs[0]
				}
				m, err := pgratelimit.AllowAll(ctx, cs...)
				if err != nil {
					t.Error(err)
					return
				}
				if m.Allowed {
					spent.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(30), spent.Load())
	o, err := org.Peek(ctx, "o1")
	require.NoError(t, err)
	require.Equal(t, int64(70), o.Remaining)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	m, err := pgratelimit.PgxTx(tx).AllowAll(ctx, org.Charge("o2", 10), user.Charge("u2", 10))
	require.NoError(t, err)
	require.True(t, m.Allowed)
	require.NoError(t, tx.Rollback(ctx))
	u, err := user.Peek(ctx, "u2")
	require.NoError(t, err)
	require.Equal(t, int64(30), u.Remaining, "rollback spends nothing")
}

// Cleanup on Citus deletes every expired row and nothing else, through
// The Cleaner, on the workers that hold the shards
// (connecting with the pool's settings), or through the coordinator when it
// cannot reach them.
func TestCitusCleanup(t *testing.T) {
	t.Parallel()
	for _, reach := range []bool{true, false} {
		t.Run(fmt.Sprintf("workers-reachable=%v", reach), func(t *testing.T) {
			t.Parallel()
			testCitusCleanup(t, reach)
		})
	}
}

func testCitusCleanup(t *testing.T, reach bool) {
	ctx := context.Background()
	pool := citusPool(t, 8)
	// A pool of the same settings that sees every connection it makes, and
	// sends those to workers to a closed port unless reach.
	coordinator := pool.Config().ConnConfig.Port
	var mu sync.Mutex
	ports := map[uint16]bool{}
	cfg := pool.Config().Copy()
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		mu.Lock()
		defer mu.Unlock()
		ports[cc.Port] = true
		if !reach && cc.Port != coordinator {
			cc.Port = 1 // connection refused
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	clock := newClock()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "c" + storage.String(), Capacity: 10, Refill: 1, Interval: time.Second, Storage: storage, Clock: clock.Now})
		require.NoError(t, err)
		for i := range 300 {
			_, err := l.AllowN(ctx, fmt.Sprintf("short-%d", i), 1) // full again after 1s: expires at the next minute
			require.NoError(t, err)
		}
		long, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "l" + storage.String(), Capacity: 10, Refill: 1, Interval: time.Hour, Storage: storage, Clock: clock.Now})
		require.NoError(t, err)
		for i := range 50 {
			_, err := long.AllowN(ctx, fmt.Sprintf("long-%d", i), 1)
			require.NoError(t, err)
		}
	}
	clock.Add(5 * time.Minute)
	mu.Lock()
	clear(ports) // the checks' own connections to the workers
	mu.Unlock()
	start := time.Now()
	n, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now, BatchSize: 7})
	require.NoError(t, err)
	t.Logf("cleanup: %d rows in %s", n, time.Since(start))
	require.Equal(t, int64(600), n)
	require.Equal(t, int64(100), countRows(t, pool, "true"), "the live rows stay")
	mu.Lock()
	delete(ports, coordinator)
	require.NotEmpty(t, ports, "cleanup connects to the workers with the pool's settings (and is refused when they are unreachable)")
	mu.Unlock()

	clock.Add(2 * time.Hour)
	c, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{Clock: clock.Now})
	require.NoError(t, err)
	n, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(100), n)
	require.Zero(t, countRows(t, pool, "true"))
}

// An application role that does not own the tables cannot take Citus's
// shard locks: its cleanup goes through the coordinator, and still deletes
// every expired row.
func TestCitusCleanupNotOwner(t *testing.T) {
	t.Parallel()
	owner := citusPool(t, 4)
	ctx := context.Background()
	var schema string
	require.NoError(t, owner.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	role := schema + "_app"
	_, err := owner.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, sql := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := owner.Exec(context.Background(), sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	_, err = owner.Exec(ctx, `GRANT USAGE ON SCHEMA `+schema+` TO `+role+`;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO `+role)
	require.NoError(t, err)
	insertExpired(t, owner, 500)

	coordinator := owner.Config().ConnConfig.Port
	var mu sync.Mutex
	var workers int
	cfg := owner.Config().Copy()
	cfg.ConnConfig.User = role
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		mu.Lock()
		defer mu.Unlock()
		if cc.Port != coordinator {
			workers++
		}
		return nil
	}
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer app.Close()
	n, err := deleteExpired(ctx, app, pgratelimit.CleanerConfig{})
	require.NoError(t, err)
	require.Equal(t, int64(500), n)
	require.Zero(t, countRows(t, owner, "true"))
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, workers, "not the owner: through the coordinator")
}

// A table left undistributed on a Citus coordinator (here the request IDs')
// is cleaned there as on plain PostgreSQL, the distributed ones on their
// shards.
func TestCitusCleanupLocalTable(t *testing.T) {
	t.Parallel()
	pool := citusPool(t, 4)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT undistribute_table('pgratelimit_requests')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgratelimit_requests (prefix, key, request_id, cost, remaining, granted, created_at, expires_at)
SELECT 'p', 'k' || i, 'r', 1, 0, 0, now() - interval '2 days', now() + CASE WHEN i < 10 THEN interval '-1 day' ELSE interval '1 day' END
FROM generate_series(0, 11) i`)
	require.NoError(t, err)
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "b", Capacity: 1, Refill: 1, Interval: time.Second})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "a") // full again within the minute
	require.NoError(t, err)

	n, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: func() time.Time { return time.Now().Add(time.Hour) }})
	require.NoError(t, err)
	require.Equal(t, int64(11), n, "ten request IDs and the bucket")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgratelimit_requests`).Scan(&left))
	require.Equal(t, 2, left)
}

// concurrently runs workers goroutines of n checks each, of the keys key(w,
// i), and returns how many were allowed.
func concurrently(t *testing.T, workers, n int, key func(w, i int) string, l *pgratelimit.Limiter) int64 {
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				r, err := l.Allow(context.Background(), key(w, i))
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return allowed.Load()
}

// Overrides on Citus: a limiter with Overrides checks through the
// coordinator, which reads the key's override after each lock; one without
// Overrides on the same prefix (routed to the workers, with routing on)
// decides under its own policy and leaves the rows' copies alone; a row made
// again (Reset) comes back under the override; a cleared override falls back
// to the policy. With routing on and off, coalesced and per check.
func TestCitusOverrides(t *testing.T) {
	t.Parallel()
	for _, routing := range []bool{true, false} {
		t.Run(fmt.Sprintf("routing=%v", routing), func(t *testing.T) {
			ctx := context.Background()
			pool := citusPool(t, 8)
			c, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{DisableRouting: !routing})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close(ctx) })
			for _, perCheck := range []bool{false, true} {
				prefix := fmt.Sprintf("ov%v", perCheck)
				on, err := c.NewLimiter(pgratelimit.Config{Prefix: prefix, Capacity: 10, Refill: 1, Interval: time.Hour, Overrides: true, DisableCoalescing: perCheck})
				require.NoError(t, err)
				off, err := c.NewLimiter(pgratelimit.Config{Prefix: prefix, Capacity: 10, Refill: 1, Interval: time.Hour, DisableCoalescing: perCheck})
				require.NoError(t, err)
				want := func(r pgratelimit.Result, err error, limit, remaining int64) {
					t.Helper()
					require.NoError(t, err)
					require.Equal(t, [2]int64{limit, remaining}, [2]int64{r.Limit, r.Remaining}, "limit, remaining")
				}

				r, err := on.SetOverride(ctx, "k", pgratelimit.Override{Capacity: 50, Refill: 1})
				want(r, err, 50, 50)
				r, err = on.AllowN(ctx, "k", 1)
				want(r, err, 50, 49)
				r, err = off.AllowN(ctx, "k", 1) // its own policy clamps
				want(r, err, 10, 9)
				r, err = on.AllowN(ctx, "k", 1) // raised again by the override
				want(r, err, 50, 48)

				// A row made again (by the limiter without Overrides, then
				// checked by the one with): full, under the override.
				require.NoError(t, off.Reset(ctx, "k"))
				r, err = off.AllowN(ctx, "k", 1)
				want(r, err, 10, 9)
				r, err = on.AllowN(ctx, "k", 1)
				want(r, err, 50, 48)

				// A key first checked after its override was set.
				r, err = on.SetOverride(ctx, "j", pgratelimit.Override{Capacity: 30, Refill: 1})
				want(r, err, 30, 30)
				require.NoError(t, on.Reset(ctx, "j"))
				r, err = on.AllowN(ctx, "j", 5)
				want(r, err, 30, 25)

				r, err = on.ClearOverride(ctx, "k")
				want(r, err, 10, 10)
				r, err = on.AllowN(ctx, "k", 1)
				want(r, err, 10, 9)
				r, err = on.ClearOverride(ctx, "j")
				want(r, err, 10, 10)
				r, err = on.AllowN(ctx, "j", 1)
				want(r, err, 10, 9)
			}
		})
	}
}

package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Exactly once under faults: 64 goroutines charge 8 keys with request IDs
// through a toxiproxy proxy while, for 5 seconds, connections are reset at
// random moments (reset_peer), stalled (timeout), backends are terminated and
// the server restarts once; every caller retries with its ID until it gets an
// answer. Every ID is charged exactly once (one ledger row each), no bucket
// gives out more than it holds, and each bucket's balance is what its ledger
// says.
func TestExactlyOnceUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := testdb.NewCluster(t, pglaunch.Options{TCP: true})
	u, err := url.Parse(in.URL)
	require.NoError(t, err)

	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "pg", "127.0.0.1:0", u.Host)
	require.NoError(t, proxy.Start())
	t.Cleanup(proxy.Stop)
	_, port, err := net.SplitHostPort(proxy.Listen)
	require.NoError(t, err)
	via := *u
	via.Host = net.JoinHostPort("127.0.0.1", port)
	q := via.Query()
	q.Set("connect_timeout", "2")
	via.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(via.String())
	require.NoError(t, err)
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	admin := clusterPool(t, in, 4) // straight to the server

	const capacity = 1_000_000
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "once", Capacity: capacity, Refill: 1, Interval: 24 * time.Hour,
		Grants: true, Ledger: true})
	require.NoError(t, err)

	// The load: each ID retried until answered.
	var (
		mu       sync.Mutex
		charged  = map[string]int64{} // allowed cost per key
		answered atomic.Int64
		retries  atomic.Int64
		done     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for w := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 77))
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				key := fmt.Sprintf("k%d", rng.IntN(8))
				cost := 1 + rng.Int64N(5)
				id := pgratelimit.WithRequestID(ctx, fmt.Sprintf("w%d-%d", w, i))
				for try := 0; ; try++ {
					cctx, cancel := context.WithTimeout(id, 3*time.Second)
					r, err := l.AllowN(cctx, key, cost)
					cancel()
					if err == nil {
						if !r.Allowed {
							t.Errorf("%s denied with a capacity of %d", key, capacity)
						}
						answered.Add(1)
						mu.Lock()
						charged[key] += cost
						mu.Unlock()
						break
					}
					retries.Add(1)
					if try > 200 {
						t.Errorf("no answer after %d tries: %v", try, err)
						return
					}
					time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
				}
			}
		})
	}

	// The faults, for 5 seconds.
	rng := rand.New(rand.NewPCG(1, 2))
	end := time.Now().Add(5 * time.Second)
	restarted := false
	for n := 0; time.Now().Before(end); n++ {
		time.Sleep(time.Duration(30+rng.IntN(50)) * time.Millisecond)
		switch {
		case !restarted && time.Until(end) < 2500*time.Millisecond:
			restarted = true
			require.NoError(t, in.Restart(ctx, "fast"))
		case n%3 == 0:
			name := fmt.Sprintf("reset-%d", n)
			_, err := proxy.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
				`{"name":%q,"type":"reset_peer","stream":"downstream","toxicity":0.5,"attributes":{"timeout":%d}}`, name, rng.IntN(20))))
			require.NoError(t, err)
			time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
			require.NoError(t, proxy.Toxics.RemoveToxic(ctx, name))
		case n%3 == 1:
			name := fmt.Sprintf("stall-%d", n)
			_, err := proxy.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
				`{"name":%q,"type":"timeout","stream":"upstream","toxicity":0.3,"attributes":{"timeout":%d}}`, name, 100+rng.IntN(400))))
			require.NoError(t, err)
			time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
			require.NoError(t, proxy.Toxics.RemoveToxic(ctx, name))
		default:
			_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND random() < 0.3`)
		}
	}
	close(done)
	wg.Wait()
	require.True(t, restarted)
	require.Positive(t, retries.Load(), "the faults made callers retry")
	require.Positive(t, answered.Load())

	// Every ID charged exactly once, the balances what the ledger says.
	var dup int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT request_id FROM pgratelimit_ledger
WHERE prefix = 'once' GROUP BY key, request_id HAVING count(*) > 1) d`).Scan(&dup))
	require.Zero(t, dup, "an ID with more than one ledger row was charged twice")
	var rows, ids int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgratelimit_ledger WHERE prefix = 'once'),
  (SELECT count(*) FROM pgratelimit_requests WHERE prefix = 'once')`).Scan(&rows, &ids))
	require.Equal(t, answered.Load(), rows, "one ledger row per answered ID")
	require.Equal(t, answered.Load(), ids)
	for k := range 8 {
		key := fmt.Sprintf("k%d", k)
		p, err := l.Peek(ctx, key)
		require.NoError(t, err)
		sum, _ := ledgerSum(t, l, key)
		require.Equal(t, int64(capacity)-charged[key], p.Remaining, "%s: the bucket lost what callers were told, once each", key)
		require.Equal(t, -charged[key], sum, "%s: the ledger adds up to it", key)
	}
	t.Logf("%d IDs answered after %d retries", answered.Load(), retries.Load())
}

package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// A Client on Citus sends checks straight to the workers that hold their
// keys' shards: the coordinator commits none of their transactions, and the
// results are exact. With DisableRouting every check goes through the
// coordinator.
func TestCitusRouting(t *testing.T) {
	for _, routing := range []bool{true, false} {
		t.Run(fmt.Sprintf("routing=%v", routing), func(t *testing.T) {
			ctx := context.Background()
			pool := citusPool(t, 16)
			before := coordinatorCommits(t, pool)
			c, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{DisableRouting: !routing})
			require.NoError(t, err)
			for _, perCheck := range []bool{false, true} {
				l, err := c.NewLimiter(pgratelimit.Config{Prefix: fmt.Sprintf("r%v", perCheck), Capacity: 5, Refill: 1, Interval: time.Hour, DisableCoalescing: perCheck})
				require.NoError(t, err)
				// 320 checks over 20 keys of capacity 5, on both workers.
				allowed := concurrently(t, 16, 20, func(w, i int) string { return fmt.Sprintf("k%d", (w*20+i)%20) }, l)
				require.Equal(t, int64(100), allowed)
			}
			require.NoError(t, c.Close(ctx))
			pool.Reset() // the backends exit, so their statistics reach pg_stat_database
			commits := coordinatorCommits(t, pool) - before
			if routing {
				require.Less(t, commits, int64(60), "the coordinator committed %d transactions for 640 routed checks", commits)
			} else {
				require.GreaterOrEqual(t, commits, int64(320), "the coordinator committed %d transactions for 640 checks, 320 of them one per transaction", commits)
			}
		})
	}
}

// coordinatorCommits is the coordinator's count of committed transactions
// in pool's database, once the backends that exited have reported theirs.
func coordinatorCommits(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	var last int64 = -1
	for range 50 { // until two readings 100 ms apart agree
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n))
		if n == last {
			return n
		}
		last = n
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// Checks stay exact, with no error, while citus_move_shard_placement moves
// the shards of the hot keys to the other worker and back: a routed check
// that finds its shard gone goes through the coordinator. Cleanup runs all
// along, on the shards' nodes, without an error either.
func TestCitusShardMoveUnderLoad(t *testing.T) {
	for _, perCheck := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-check=%v", perCheck), func(t *testing.T) {
			ctx := context.Background()
			pool := citusPool(t, 32)
			clock := newClock() // no refill during the test
			l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "m", Capacity: 400, Refill: 1, Interval: time.Hour, Clock: clock.Now, DisableCoalescing: perCheck})
			require.NoError(t, err)
			const keys = 8
			key := func(i int) string { return fmt.Sprintf("move-%d", i%keys) }
			// Warm up, so that the client has routed before the moves.
			for i := range keys {
				_, err := l.Allow(ctx, key(i))
				require.NoError(t, err)
			}

			var allowed [keys]atomic.Int64
			var errs atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						r, err := l.Allow(ctx, key(i))
						if err != nil {
							if errs.Add(1) <= 3 {
								t.Errorf("check during the moves: %v", err)
							}
							continue
						}
						if r.Allowed {
							allowed[i%keys].Add(1)
						}
					}
				}()
			}
			var cleanups atomic.Int64
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now}); err != nil {
						t.Errorf("cleanup during the moves: %v", err)
						return
					}
					cleanups.Add(1)
				}
			}()
			time.Sleep(300 * time.Millisecond)
			shard, from, to := shardAndOtherNode(t, pool, key(0))
			moveShard(t, pool, shard, from, to)
			time.Sleep(300 * time.Millisecond)
			moveShard(t, pool, shard, to, from)
			time.Sleep(300 * time.Millisecond)
			close(stop)
			wg.Wait()

			require.Zero(t, errs.Load())
			require.Positive(t, cleanups.Load())
			var total int64
			for i := range keys {
				r, err := l.Peek(ctx, key(i))
				require.NoError(t, err)
				// The warm-up took one token of each key.
				require.Equal(t, int64(400)-1-allowed[i].Load(), r.Remaining, "key %s", key(i))
				total += allowed[i].Load()
			}
			require.Positive(t, total)
		})
	}
}

// shardAndOtherNode returns the shard of the durable table that holds key,
// the node it is on, and another worker.
func shardAndOtherNode(t *testing.T, pool *pgxpool.Pool, key string) (shard int64, from, to node) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pool.QueryRow(ctx, `SELECT s, n.nodename, n.nodeport
FROM get_shard_id_for_distribution_column('pgratelimit_buckets', $1::text) s
JOIN pg_dist_placement p ON p.shardid = s JOIN pg_dist_node n USING (groupid)`, key).Scan(&shard, &from.host, &from.port))
	err := pool.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_dist_node
WHERE shouldhaveshards AND noderole = 'primary' AND isactive AND NOT (nodename = $1 AND nodeport = $2)
ORDER BY nodeid LIMIT 1`, from.host, from.port).Scan(&to.host, &to.port)
	if err == pgx.ErrNoRows {
		t.Skip("the Citus cluster has one worker: no other node to move a shard to")
	}
	require.NoError(t, err)
	return shard, from, to
}

type node struct {
	host string
	port int32
}

// moveShard moves shard (and its colocated shards) from one node to
// another, blocking writes while it copies (logical replication needs
// wal_level logical, which a test cluster may not have).
func moveShard(t *testing.T, pool *pgxpool.Pool, shard int64, from, to node) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `SELECT citus_move_shard_placement($1, $2, $3, $4, $5, shard_transfer_mode => 'block_writes')`,
		shard, from.host, from.port, to.host, to.port)
	require.NoError(t, err)
}

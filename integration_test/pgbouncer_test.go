package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The exactness test through PgBouncer in transaction pooling mode, in each
// of pgx's query modes that work with it, with and without coalescing.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := testdb.PgBouncer(t)
	for _, queryMode := range []string{"exec", "cache_describe", "simple_protocol"} {
		for _, coalesce := range []bool{false, true} {
			name := queryMode + "/per-check"
			if coalesce {
				name = queryMode + "/coalesce"
			}
			t.Run(name, func(t *testing.T) {
				cfg, err := pgxpool.ParseConfig(url + "&default_query_exec_mode=" + queryMode)
				require.NoError(t, err)
				cfg.MaxConns = 32
				pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
				require.NoError(t, err)
				defer pool.Close()
				l, err := pgratelimit.New(pool, pgratelimit.Config{
					Prefix: name, Capacity: 100, Refill: 1, Interval: time.Hour,
					DisableCoalescing: !coalesce, LockTimeout: 5 * time.Second,
				})
				require.NoError(t, err)
				_, allowed := hammer(t, []*pgratelimit.Limiter{l}, 64, 1000, "one-key", func() int64 { return 1 })
				require.Equal(t, int64(100), allowed)
				r, err := l.Peek(context.Background(), "one-key")
				require.NoError(t, err)
				require.Equal(t, int64(0), r.Remaining)

				// Many keys at once: batches of more rows than PerRowMax
				// send their arrays as slices, in this query mode.
				var wg sync.WaitGroup
				for i := range 64 {
					wg.Go(func() {
						for range 10 {
							r, err := l.Allow(context.Background(), fmt.Sprintf("key-%d", i%32))
							assert.NoError(t, err)
							assert.True(t, r.Allowed)
						}
					})
				}
				wg.Wait()
				for i := range 32 {
					r, err := l.Peek(context.Background(), fmt.Sprintf("key-%d", i))
					require.NoError(t, err)
					require.Equal(t, int64(80), r.Remaining)
				}
			})
		}
	}
}

package integration

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// twoPools returns limiters on two pools over one schema, with the database's
// clock and no refill during the test.
func twoPools(t *testing.T, storage pgratelimit.Storage) []*pgratelimit.Limiter {
	t.Helper()
	s := testdb.NewSchema(t)
	var ls []*pgratelimit.Limiter
	for range 2 {
		l, err := newLimiterOn(s.Pool(t, 32), pgratelimit.Config{
			Prefix: "hot", Capacity: 100, Refill: 1, Interval: time.Hour, Storage: storage,
		})
		require.NoError(t, err)
		ls = append(ls, l)
	}
	return ls
}

// Exactly Capacity checks are allowed out of many concurrent ones on one key.
func TestExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		t.Run(storage.String(), func(t *testing.T) {
			t.Parallel()
			ls := twoPools(t, storage)
			_, allowed := hammer(t, ls, 64, 1000, "one-key", func() int64 { return 1 })
			require.Equal(t, int64(100), allowed)

			r, err := ls[0].Peek(context.Background(), "one-key")
			require.NoError(t, err)
			require.Equal(t, int64(0), r.Remaining)
		})
	}
}

// With random costs, the cost allowed plus what remains is exactly Capacity.
func TestExactUnderConcurrencyRandomCosts(t *testing.T) {
	t.Parallel()
	ls := twoPools(t, pgratelimit.Durable)
	allowedCost, _ := hammer(t, ls, 64, 1000, "one-key", func() int64 { return 1 + rand.Int64N(5) })
	r, err := ls[1].Peek(context.Background(), "one-key")
	require.NoError(t, err)
	require.Equal(t, int64(100), allowedCost+r.Remaining)
	require.Less(t, r.Remaining, int64(5), "with 1000 attempts the bucket is drained below the largest cost")
}

// A denied check writes nothing: the row's xmin does not change.
func TestDeniedWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "deny", Capacity: 2, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "k", 2)
	require.NoError(t, err)

	row := func() (xmin string, tokens int64) {
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT xmin::text, tokens FROM pgratelimit_buckets WHERE prefix = 'deny' AND key = 'k'`).Scan(&xmin, &tokens))
		return xmin, tokens
	}
	xmin, tokens := row()
	require.Equal(t, int64(0), tokens)
	for range 5 {
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed)
	}
	xmin2, tokens2 := row()
	require.Equal(t, xmin, xmin2)
	require.Equal(t, tokens, tokens2)
}

// Rows deleted concurrently (as cleanup does) are re-inserted inside the
// check's transaction, never reported as errors.
func TestConcurrentDeleter(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "its deleter locks rows by ctid across the table, which Citus rejects (cleanup runs per shard there: TestCitusCleanup)")
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 16)
	l, err := newLimiterOn(pool, pgratelimit.Config{
		Prefix: "del", Capacity: 1000000, Refill: 1, Interval: time.Hour,
	})
	require.NoError(t, err)

	stop := make(chan struct{})
	deleterDone := make(chan int64)
	go func() {
		var deleted int64
		for {
			select {
			case <-stop:
				deleterDone <- deleted
				return
			default:
			}
			// Two kinds of delete, as a cleanup job would do them: several
			// rows skipping locked ones, and single rows, waiting for them.
			// (A plain multi-row DELETE that waits on rows in arbitrary
			// order can deadlock with coalesced batches; see README.)
			for _, del := range []struct {
				sql  string
				args []any
			}{
				{`DELETE FROM pgratelimit_buckets WHERE ctid = ANY(ARRAY(
					SELECT ctid FROM pgratelimit_buckets WHERE prefix = 'del' FOR UPDATE SKIP LOCKED))`, nil},
				{`DELETE FROM pgratelimit_buckets WHERE prefix = 'del' AND key = $1`, []any{"a"}},
				{`DELETE FROM pgratelimit_buckets WHERE prefix = 'del' AND key = $1`, []any{"b"}},
				{`DELETE FROM pgratelimit_buckets WHERE prefix = 'del' AND key = $1`, []any{"c"}},
			} {
				tag, err := pool.Exec(ctx, del.sql, del.args...)
				if err != nil {
					t.Errorf("deleter %q: %v", del.sql[:40], err)
				}
				deleted += tag.RowsAffected()
			}
		}
	}()
	var wg sync.WaitGroup
	var checks atomic.Int64
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				key := []string{"a", "b", "c"}[(w+i)%3]
				r, err := l.Allow(ctx, key)
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				if !r.Allowed {
					t.Errorf("denied with a bucket of a million")
					return
				}
				checks.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	deleted := <-deleterDone
	require.Equal(t, int64(12*300), checks.Load())
	require.Positive(t, deleted, "the deleter removed rows while checks ran")
	t.Logf("%d checks, %d rows deleted under them", checks.Load(), deleted)
}

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// A check that cannot get its row lock within LockTimeout fails with the
// typed, retryable ErrLockTimeout and spends nothing.
func TestLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "lt", Capacity: 10, Refill: 1, Interval: time.Hour, LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "hot")
	require.NoError(t, err)

	holder := lockRow(t, pool, "lt", "hot")

	_, err = l.AllowN(ctx, "hot", 3)
	require.ErrorIs(t, err, pgratelimit.ErrLockTimeout)
	require.NoError(t, holder.Rollback(ctx))

	r, err := l.Peek(ctx, "hot")
	require.NoError(t, err)
	require.Equal(t, int64(9), r.Remaining, "the timed-out check spent nothing")
	r, err = l.AllowN(ctx, "hot", 3) // retried: fine now
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(6), r.Remaining)

	_, err = pgratelimit.New(pool, pgratelimit.Config{Prefix: "lt", Capacity: 1, Refill: 1, Interval: time.Hour, LockTimeout: time.Microsecond})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// sqlRecorder is a pgx tracer that records the statements sent.
type sqlRecorder struct {
	mu   sync.Mutex
	sqls []string
}

func (r *sqlRecorder) add(sql string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sqls = append(r.sqls, fmt.Sprint(sql, args))
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL, d.Args)
	return ctx
}
func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(d.SQL, d.Args)
}
func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *sqlRecorder) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sqls {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}

// AsyncCommit sets synchronous_commit off for the limiter's own
// transactions, and only there.
func TestAsyncCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	rec := &sqlRecorder{}
	cfg := s.Config.Copy()
	cfg.ConnConfig.Tracer = rec
	pool := s.PoolWithConfig(t, cfg)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "ac", Capacity: 100, Refill: 1, Interval: time.Hour, Storage: pgratelimit.Ephemeral, AsyncCommit: true})
	require.NoError(t, err)
	for range 5 {
		r, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	require.Equal(t, 5, rec.count("synchronous_commit"), "one SET LOCAL per check transaction")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var before, setting string
	require.NoError(t, tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&before)) // the server's default
	_, err = l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting))
	require.Equal(t, before, setting, "the caller's transaction is left alone")
	require.NoError(t, tx.Commit(ctx))
	r, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(94), r.Remaining)
}

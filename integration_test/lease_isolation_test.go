package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// An acquisition in a REPEATABLE READ transaction whose snapshot is older
// than another's acquisition of the same key fails with a serialization
// error: it cannot count the lease it does not see.
func TestLeaseRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "rr", Max: 1, TTL: time.Minute})
	// The key's row exists before the snapshot.
	r, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, "k", r.Lease.ID))

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	// The snapshot, taken by a read of the key's row: on Citus a
	// transaction's snapshot on a node is taken by its first statement
	// there (a SELECT 1 would leave the acquisition a fresh one, which
	// sees the other lease and denies).
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgratelimit_buckets WHERE prefix = 'rr' AND key = 'k'`)
	require.NoError(t, err)

	r, err = s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)

	r, err = s.In(pgratelimit.PgxTx(tx)).Acquire(ctx, "k", 1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "acquired %+v on a full key", r)
	require.Equal(t, pgerrcode.SerializationFailure, pgErr.Code)
}

// A key's row deleted (by cleanup) while an acquisition waits for its lock,
// and written anew with a lease: the acquisition locks the new row, reads
// its leases with the lock, and its answer counts what the deleting
// transaction left.
func TestLeaseRowDeletedWhileLocking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "del", Max: 1, TTL: time.Minute})
	r, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, "k", r.Lease.ID))

	tx := lockRow(t, pool, "del", "k")
	pid := holderID(t, tx)
	type answer struct {
		r   pgratelimit.LeaseResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := s.Acquire(ctx, "k", 1)
		got <- answer{r, err}
	}()
	require.Eventually(t, func() bool { return blockedBy(t, pool, pid) > 0 }, 10*time.Second, 5*time.Millisecond)
	_, err = tx.Exec(ctx, `DELETE FROM pgratelimit_buckets WHERE prefix = 'del' AND key = 'k'`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO pgratelimit_buckets (prefix, key, tokens, refilled_at, expires_at, leases)
VALUES ('del', 'k', 0, '0001-01-01', now() + interval '2 minutes',
        json_build_array(json_build_object('id', 'other', 'weight', 1, 'token', 0, 'acquired_at', now(), 'expires_at', now() + interval '1 minute')))`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	a := <-got
	require.NoError(t, a.err)
	require.False(t, a.r.Allowed, "the other lease holds the only unit")
	require.Equal(t, int64(1), a.r.Limit-a.r.Remaining)
}

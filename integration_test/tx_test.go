package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// AllowNTx spends tokens only if the caller's transaction commits.
func TestAllowNTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "credits", Capacity: 100, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE uploads (id bigserial PRIMARY KEY, owner text NOT NULL)`)
	require.NoError(t, err)

	spend := func(commit bool) pgratelimit.Result {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		r, err := l.AllowNTx(ctx, tx, "acct-1", 30)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		_, err = tx.Exec(ctx, `INSERT INTO uploads (owner) VALUES ('acct-1')`)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
		return r
	}

	r := spend(false)
	require.Equal(t, int64(70), r.Remaining, "inside the transaction the tokens are taken")
	p, err := l.Peek(ctx, "acct-1")
	require.NoError(t, err)
	require.Equal(t, int64(100), p.Remaining, "rollback gives them back")

	spend(true)
	p, err = l.Peek(ctx, "acct-1")
	require.NoError(t, err)
	require.Equal(t, int64(70), p.Remaining, "commit spends them")
	var uploads int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM uploads`).Scan(&uploads))
	require.Equal(t, 1, uploads)

	// Denied inside a transaction: the caller sees Allowed false and decides.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	r, err = l.AllowNTx(ctx, tx, "acct-1", 71)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.NoError(t, tx.Commit(ctx))
}

// The row lock is held until the caller's transaction ends: a second check of
// the same key waits for it, then sees its effect.
func TestAllowNTxHoldsLockUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "lock", Capacity: 10, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	require.NoError(t, err)
	_, err = l.AllowNTx(ctx, tx, "k", 10)
	require.NoError(t, err)

	done := make(chan pgratelimit.Result)
	go func() {
		r, err := l.Allow(ctx, "k")
		if err != nil {
			t.Errorf("concurrent check: %v", err)
		}
		done <- r
	}()
	select {
	case <-done:
		t.Fatal("a concurrent check did not wait for the transaction holding the row")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.False(t, r.Allowed, "after the commit, the bucket is empty")
}

package integration

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// billing is a limiter with the ledger and grants on: 100 credits, refilled
// 100 every 30 days, on clock (the database's if nil).
func billing(t *testing.T, pool *pgxpool.Pool, prefix string, clock *fakeClock) *pgratelimit.Limiter {
	t.Helper()
	cfg := pgratelimit.Config{Prefix: prefix, Capacity: 100, Refill: 100, Interval: 30 * 24 * time.Hour, Grants: true, Ledger: true}
	if clock != nil {
		cfg.Clock = clock.Now
	}
	l, err := newLimiterOn(pool, cfg)
	require.NoError(t, err)
	return l
}

// ledgerSum is the sum of key's ledger amounts and its rows.
func ledgerSum(t *testing.T, l *pgratelimit.Limiter, key string) (int64, []pgratelimit.LedgerEntry) {
	t.Helper()
	es, err := l.Ledger(context.Background(), key, time.Time{})
	require.NoError(t, err)
	var sum int64
	for _, e := range es {
		sum += e.Amount
	}
	return sum, es
}

// A retry with the same request ID returns the first outcome and charges
// nothing; another ID charges; a denied check records nothing, so its retry
// is decided afresh.
func TestRequestIDChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := billing(t, newPool(t), "once", clock)
	first, err := l.AllowN(pgratelimit.WithRequestID(ctx, "req-1"), "k", 30)
	require.NoError(t, err)
	require.True(t, first.Allowed)
	require.Equal(t, int64(70), first.Remaining)
	for range 3 {
		again, err := l.AllowN(pgratelimit.WithRequestID(ctx, "req-1"), "k", 30)
		require.NoError(t, err)
		require.True(t, again.Allowed)
		require.Equal(t, int64(70), again.Remaining, "the first outcome")
	}
	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(70), p.Remaining, "charged once")

	r, err := l.AllowN(pgratelimit.WithRequestID(ctx, "req-2"), "k", 60)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(10), r.Remaining)
	r, err = l.AllowN(pgratelimit.WithRequestID(ctx, "req-3"), "k", 20)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	_, err = l.Grant(ctx, "k", 50, time.Time{})
	require.NoError(t, err)
	r, err = l.AllowN(pgratelimit.WithRequestID(ctx, "req-3"), "k", 20)
	require.NoError(t, err)
	require.True(t, r.Allowed, "the denied check recorded nothing: its retry is decided afresh")
	require.Equal(t, int64(0), r.Remaining)
	require.Equal(t, int64(40), r.Granted)

	sum, es := ledgerSum(t, l, "k")
	require.Len(t, es, 4, "charge, charge, grant, charge: one row each, none for the replays or the denial")
	require.Equal(t, int64(-30-60+50-20), sum)
	require.Equal(t, int64(40), es[len(es)-1].Balance)
	require.Equal(t, "req-3", es[len(es)-1].RequestID)

	_, err = l.AllowN(pgratelimit.WithRequestID(ctx, ""), "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidRequestID)
	_, err = l.AllowN(pgratelimit.WithRequestID(ctx, "a\x00b"), "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidRequestID)
}

// Concurrent checks with one ID: exactly one charges, every one gets its
// outcome.
func TestRequestIDConcurrent(t *testing.T) {
	t.Parallel()
	requestIDsConcurrently(t, newPool(t))
}

// The same through PgBouncer in transaction mode.
func TestRequestIDThroughPgBouncer(t *testing.T) {
	t.Parallel()
	requestIDsConcurrently(t, pgbouncerPool(t))
}

func requestIDsConcurrently(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	l := billing(t, pool, "conc", nil)
	var wg sync.WaitGroup
	results := make([]pgratelimit.Result, 64)
	for i := range results {
		wg.Go(func() {
			id := fmt.Sprintf("job-%d", i%4)
			r, err := l.AllowN(pgratelimit.WithRequestID(ctx, id), "k", 7)
			if err != nil {
				t.Errorf("check: %v", err)
			}
			results[i] = r
		})
	}
	wg.Wait()
	seen := map[int]int64{}
	for i, r := range results {
		require.True(t, r.Allowed)
		if rem, ok := seen[i%4]; ok {
			require.Equal(t, rem, r.Remaining, "every check of job-%d gets the first one's outcome", i%4)
		}
		seen[i%4] = r.Remaining
	}
	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(100-4*7), p.Remaining, "four IDs, four charges")
	sum, es := ledgerSum(t, l, "k")
	require.Len(t, es, 4)
	require.Equal(t, int64(-28), sum)
}

// AllowAll with one ID records it for every bucket and replays the call; in
// the caller's transaction the ID is used only if it commits.
func TestRequestIDAllowAllAndTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	user := billing(t, pool, "user", nil)
	org := billing(t, pool, "org", nil)
	call := func(ctx context.Context) pgratelimit.MultiResult {
		m, err := pgratelimit.AllowAll(ctx, user.Charge("u", 10), org.Charge("o", 10))
		require.NoError(t, err)
		return m
	}
	a := call(pgratelimit.WithRequestID(ctx, "job-1"))
	b := call(pgratelimit.WithRequestID(ctx, "job-1"))
	require.True(t, a.Allowed)
	require.Equal(t, a.Results[0].Remaining, b.Results[0].Remaining)
	require.Equal(t, a.Results[1].Remaining, b.Results[1].Remaining)
	require.Equal(t, int64(90), b.Results[1].Remaining)

	// In the caller's transaction, through pgx and database/sql (pgx's
	// stdlib and lib/pq): a rolled-back ID was never used.
	pq, err := sql.Open("postgres", s.URL(t))
	require.NoError(t, err)
	defer pq.Close()
	std := stdlib.OpenDBFromPool(pool)
	defer std.Close()
	type txFuncs struct {
		allow            func(ctx context.Context) (pgratelimit.Result, error)
		commit, rollback func() error
	}
	begins := map[string]func(ctx context.Context) txFuncs{
		"pgx": func(ctx context.Context) txFuncs {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			return txFuncs{func(ctx context.Context) (pgratelimit.Result, error) {
				return user.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "u", 5)
			},
				func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }}
		},
	}
	for name, db := range map[string]*sql.DB{"database/sql+pgx": std, "database/sql+lib/pq": pq} {
		begins[name] = func(ctx context.Context) txFuncs {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			return txFuncs{func(ctx context.Context) (pgratelimit.Result, error) {
				return user.In(pgratelimit.SQLTx(tx)).AllowN(ctx, "u", 5)
			},
				tx.Commit, tx.Rollback}
		}
	}
	for name, begin := range begins {
		id := pgratelimit.WithRequestID(ctx, "tx-"+name)
		before, err := user.Peek(ctx, "u")
		require.NoError(t, err)
		tx := begin(ctx)
		_, err = tx.allow(id)
		require.NoError(t, err, name)
		require.NoError(t, tx.rollback())
		tx = begin(ctx)
		r, err := tx.allow(id)
		require.NoError(t, err, name)
		require.Equal(t, before.Remaining-5, r.Remaining, "%s: the rolled-back ID was never used", name)
		require.NoError(t, tx.commit())
		r, err = user.AllowN(id, "u", 5)
		require.NoError(t, err)
		require.Equal(t, before.Remaining-5, r.Remaining, "%s: the committed one was", name)
	}
}

// Settle an estimate to its actual cost: the difference back, or charged
// beyond the estimate into a debt that refills repay; settling again at the
// same cost changes nothing and returns the first settlement, at another is
// ErrRequestMismatch.
func TestSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	l := billing(t, newPool(t), "settle", clock)
	est := func(id string, n int64) pgratelimit.Result {
		r, err := l.AllowN(pgratelimit.WithRequestID(ctx, id), "k", n)
		require.NoError(t, err)
		return r
	}
	require.True(t, est("llm-1", 40).Allowed)
	r, err := l.Settle(ctx, "k", "llm-1", 25)
	require.NoError(t, err)
	require.Equal(t, int64(75), r.Remaining, "15 back")
	again, err := l.Settle(ctx, "k", "llm-1", 25)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	r.Replayed = true
	require.Equal(t, r, again, "settled before: the first settlement's outcome")
	_, err = l.Settle(ctx, "k", "llm-1", 5)
	require.ErrorIs(t, err, pgratelimit.ErrRequestMismatch, "settled before at another cost")

	require.True(t, est("llm-2", 70).Allowed)
	r, err = l.Settle(ctx, "k", "llm-2", 90)
	require.NoError(t, err)
	require.Equal(t, int64(-15), r.Remaining, "work done is owed: a debt")
	r, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, r.Allowed, "denied while the balance does not cover it")

	_, err = l.Settle(ctx, "k", "never", 3)
	require.ErrorIs(t, err, pgratelimit.ErrUnknownRequest)
	_, err = l.Settle(ctx, "k", "llm-3", -1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidCost)

	r, err = l.Debit(ctx, "k", 5)
	require.NoError(t, err)
	require.Equal(t, int64(-20), r.Remaining)
	clock.Add(30 * 24 * time.Hour) // a refill of 100 repays the debt
	r, err = l.AllowN(ctx, "k", 80)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(0), r.Remaining)

	sum, es := ledgerSum(t, l, "k")
	kinds := make([]string, len(es))
	for i, e := range es {
		kinds[i] = e.Kind
	}
	require.Equal(t, []string{"charge", "settle", "charge", "settle", "debit", "charge"}, kinds)
	require.Equal(t, int64(-40+15-70-20-5-80), sum)
	require.Equal(t, int64(0), es[len(es)-1].Balance)
	require.Equal(t, int64(-20), es[4].Balance)
}

// Refunds, grants and resets are in the ledger too; a refund capped at
// Capacity records what it gave.
func TestLedgerKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := billing(t, newPool(t), "kinds", newClock())
	_, err := l.AllowN(ctx, "k", 30)
	require.NoError(t, err)
	_, err = l.Refund(ctx, "k", 50) // 30 fit
	require.NoError(t, err)
	_, err = l.Grant(ctx, "k", 7, time.Time{})
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "k", 40)
	require.NoError(t, err)
	require.NoError(t, l.Reset(ctx, "k"))
	_, es := ledgerSum(t, l, "k")
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%s %+d = %d", e.Kind, e.Amount, e.Balance))
	}
	require.Equal(t, []string{"charge -30 = 70", "refund +30 = 100", "grant +7 = 107", "charge -40 = 67", "reset +40 = 107"}, got)

	_, err = newLimiterOn(newPool(t), pgratelimit.Config{Prefix: "e", Capacity: 1, Refill: 1, Interval: time.Hour, Ledger: true, Storage: pgratelimit.Ephemeral})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// Cleanup forgets request IDs after Config.RequestIDRetention, and ledger
// rows after CleanerConfig.LedgerRetention.
func TestRequestIDRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "ret", Capacity: 100, Refill: 1, Interval: time.Hour, Ledger: true, RequestIDRetention: time.Hour, Clock: clock.Now})
	require.NoError(t, err)
	id := pgratelimit.WithRequestID(ctx, "r")
	_, err = l.AllowN(id, "k", 10)
	require.NoError(t, err)
	clock.Add(30 * time.Minute)
	_, err = deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now})
	require.NoError(t, err)
	r, err := l.AllowN(id, "k", 10)
	require.NoError(t, err)
	require.Equal(t, int64(90), r.Remaining, "remembered within the retention")
	clock.Add(time.Hour)
	_, err = deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now, LedgerRetention: time.Hour})
	require.NoError(t, err)
	_, es := ledgerSum(t, l, "k")
	require.Empty(t, es, "ledger rows older than an hour are gone")
	r, err = l.AllowN(id, "k", 10)
	require.NoError(t, err)
	require.Equal(t, int64(81), r.Remaining, "forgotten after the retention: charged again (one refill meanwhile)")
}

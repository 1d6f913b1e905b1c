package integration

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// An override raised mid-period on a key under 64 concurrent checks takes
// effect for every check that locks the row after it commits: every check
// that starts after SetOverride returned is decided under it (Limit 1000),
// the key gives exactly the old capacity plus the difference, and the
// ledger adds up (one plan row, every balance the previous one plus the
// amount: the clock stands still, so no refill falls in between). Directly
// and through PgBouncer in transaction mode, in the suite's coalescing mode.
func TestOverrideUnderLoad(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			var pool *pgxpool.Pool
			if via == "pgbouncer" {
				pool = pgbouncerPool(t)
			} else {
				pool = newPool(t)
			}
			clock := newClock()
			l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "raise", Capacity: 100, Refill: 1, Interval: time.Hour,
				Clock: clock.Now, Ledger: true, Overrides: true, LockTimeout: 10 * time.Second})
			require.NoError(t, err)
			overrideLoad(t, l)
		})
	}
}

func overrideLoad(t *testing.T, l *pgratelimit.Limiter) {
	ctx := context.Background()
	const workers, attempts, key = 64, 2500, "hot"
	var (
		next, allowed atomic.Int64
		set           atomic.Bool // SetOverride has returned
		wg            sync.WaitGroup
		errs          = make(chan error, workers+1)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= attempts {
				after := set.Load()
				r, err := l.AllowN(ctx, key, 1)
				if err != nil {
					errs <- err
					return
				}
				if after && r.Limit != 1000 {
					t.Errorf("a check that started after the override committed was decided under Limit %d", r.Limit)
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for allowed.Load() < 40 && next.Load() < attempts {
			time.Sleep(time.Millisecond)
		}
		r, err := l.SetOverride(ctx, key, pgratelimit.Override{Capacity: 1000, Refill: 1, Note: "raised under load"})
		if err != nil {
			errs <- err
			return
		}
		set.Store(true)
		if r.Limit != 1000 {
			t.Errorf("SetOverride: Limit %d", r.Limit)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v", err)
	}
	require.Equal(t, int64(1000), allowed.Load(), "allowed: the first 100 and the 900 the override added")
	r, err := l.Peek(ctx, key)
	require.NoError(t, err)
	require.Equal(t, int64(0), r.Remaining)
	require.Equal(t, int64(1000), r.Limit)

	es, err := l.Ledger(ctx, key, time.Time{})
	require.NoError(t, err)
	balance, plans, charged := int64(100), 0, int64(0)
	for _, e := range es {
		balance += e.Amount
		require.Equal(t, balance, e.Balance, "entry %d (%s %d)", e.ID, e.Kind, e.Amount)
		switch e.Kind {
		case "plan":
			plans++
			require.Equal(t, int64(900), e.Amount)
		case "charge":
			charged -= e.Amount
		default:
			t.Fatalf("unexpected ledger entry %+v", e)
		}
	}
	require.Equal(t, 1, plans)
	require.Equal(t, int64(1000), charged)
	require.Equal(t, int64(0), balance)
}

// Cleanup never changes a decision of a limiter with Overrides either: a
// row it deletes is a full bucket, and the row a check makes again copies
// the key's override, so it is full under it (TestCleanupNeverChangesADecision
// with overrides raised, lowered, ending, and cleared along the way, set
// through limiters of both storages on the prefix).
func TestOverrideCleanupNeverChangesADecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock()
	var pools [2]*pgxpool.Pool
	var limiters [2][2]*pgratelimit.Limiter // [cleaned?][storage]
	for i := range pools {
		pools[i] = newPool(t)
		for s, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
			l, err := newLimiterOn(pools[i], pgratelimit.Config{
				Prefix: "same", Capacity: 7, Refill: 2, Interval: 10 * time.Second, Storage: storage, Clock: clock.Now, Overrides: true,
			})
			require.NoError(t, err)
			limiters[i][s] = l
		}
	}
	set := func(s int, key string, o pgratelimit.Override) {
		var got [2]pgratelimit.Result
		for i := range got {
			r, err := limiters[i][s].SetOverride(ctx, key, o)
			require.NoError(t, err)
			got[i] = r
		}
		require.Equal(t, got[0], got[1], "set %s", key)
	}
	set(0, "k1", pgratelimit.Override{Capacity: 30, Refill: 5})
	set(1, "k3", pgratelimit.Override{Capacity: 3, Refill: 1})
	set(0, "k5", pgratelimit.Override{Capacity: 12, Refill: 1, Until: clock.Now().Add(20 * time.Minute)})
	rng := rand.New(rand.NewPCG(3, 4))
	var deleted int64
	for step := range 600 {
		switch step {
		case 200:
			set(1, "k6", pgratelimit.Override{Capacity: 40, Refill: 1})
		case 400:
			for i := range pools {
				_, err := limiters[i][1].ClearOverride(ctx, "k1")
				require.NoError(t, err)
			}
		}
		if step%20 == 0 {
			clock.Add(time.Duration(rng.IntN(200)) * time.Second)
			n, err := deleteExpired(ctx, pools[1], pgratelimit.CleanerConfig{Clock: clock.Now, BatchSize: 3})
			require.NoError(t, err)
			deleted += n
		}
		clock.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
		key := fmt.Sprintf("k%d", rng.IntN(8))
		s := rng.IntN(2)
		var got [2]pgratelimit.Result
		if rng.IntN(4) == 0 {
			for i := range got {
				r, err := limiters[i][s].Peek(ctx, key)
				require.NoError(t, err)
				got[i] = r
			}
		} else {
			cost := 1 + rng.Int64N(7)
			for i := range got {
				r, err := limiters[i][s].AllowN(ctx, key, cost)
				require.NoError(t, err)
				got[i] = r
			}
		}
		require.Equal(t, got[0], got[1], "step %d, key %s", step, key)
	}
	require.Positive(t, deleted, "cleanup deleted rows along the way")
	t.Logf("%d rows deleted by cleanups between the checks", deleted)
}

// SetOverride and ClearOverride in the caller's database/sql transaction,
// with pgx's stdlib and lib/pq (the override columns written as NULL by a
// clear travel as any driver sends them): written on commit, in both
// tables.
func TestOverrideThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	std := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = std.Close() })
	pq, err := sql.Open("postgres", s.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pq.Close() })
	for name, db := range map[string]*sql.DB{"pgx": std, "pq": pq} {
		t.Run(name, func(t *testing.T) {
			var ls [2]*pgratelimit.Limiter
			for i, st := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
				l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "sql-" + name, Capacity: 10, Refill: 1, Interval: time.Hour, Storage: st, Overrides: true})
				require.NoError(t, err)
				ls[i] = l
			}
			in := func(f func(tx pgratelimit.Tx)) {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }()
				f(pgratelimit.SQLTx(tx))
				require.NoError(t, tx.Commit())
			}
			in(func(tx pgratelimit.Tx) {
				r, err := ls[1].In(tx).SetOverride(ctx, "k", pgratelimit.Override{Capacity: 40, Refill: 1, Until: time.Now().Add(time.Hour), Note: "sql"})
				require.NoError(t, err)
				require.Equal(t, int64(40), r.Limit)
			})
			for _, l := range ls {
				r, err := l.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.Equal(t, int64(40), r.Limit)
			}
			in(func(tx pgratelimit.Tx) {
				_, err := ls[0].In(tx).ClearOverride(ctx, "k")
				require.NoError(t, err)
			})
			for _, l := range ls {
				r, err := l.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				require.Equal(t, int64(10), r.Limit)
			}
		})
	}
}

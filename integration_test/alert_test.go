package integration

// Usage alerts: what fires, once per line, key and period, in the check's
// transaction.

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
	"github.com/stretchr/testify/require"
)

// listEvents is every event of prefix, oldest first.
func listEvents(t *testing.T, pool *pgxpool.Pool, prefix string) []events.Event {
	t.Helper()
	evs, err := events.List(context.Background(), pool, events.Filter{Prefix: prefix, Limit: 10000})
	require.NoError(t, err)
	return evs
}

// alertLimiter is a limiter on pool in the suite's mode.
func alertLimiter(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.Config) *pgratelimit.Limiter {
	t.Helper()
	l, err := newLimiterOn(pool, cfg)
	require.NoError(t, err)
	return l
}

// line is what identifies an event in the tests: its kind and line.
type line struct {
	kind     events.Kind
	fraction float64
	level    int64
}

func lineOf(e events.Event) line { return line{e.Kind, e.Fraction, e.Level} }

func used(f float64) line { return line{kind: events.Used, fraction: f} }
func below(l int64) line  { return line{kind: events.Below, level: l} }
func exhausted() line     { return line{kind: events.Exhausted} }
func lines(evs []events.Event) []line {
	out := make([]line, len(evs))
	for i, e := range evs {
		out[i] = lineOf(e)
	}
	return out
}

// A monthly quota with grants: each line fires on the charge that first
// crosses it, with the balance after it; refunds and grants that lift the
// balance back do not re-arm a line; a denial fires Exhausted once; the
// next month fires every line again.
func TestAlertsOncePerPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock() // 2026-01-01 12:00 UTC
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "q", Capacity: 100, Refill: 100, Grants: true, Clock: clock.Now,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		Alerts:   pgratelimit.Alerts{UsedFractions: []float64{1, 0.5, 0.8}, BalanceAtOrBelow: []int64{0, 20}, Exhausted: true}})
	step := func(cost int64, allowed bool, want ...line) {
		t.Helper()
		before := len(listEvents(t, pool, "q"))
		r, err := l.AllowN(ctx, "k", cost)
		require.NoError(t, err)
		require.Equal(t, allowed, r.Allowed, "cost %d", cost)
		evs := listEvents(t, pool, "q")[before:]
		if len(want) == 0 {
			want = []line{}
		}
		require.Equal(t, want, lines(evs), "cost %d", cost)
		for _, e := range evs {
			require.Equal(t, r.Remaining+r.Granted, e.Balance)
			require.Equal(t, r.Remaining, e.Remaining)
			require.Equal(t, int64(100), e.Capacity)
			require.Equal(t, "k", e.Key)
			require.Equal(t, clock.Now(), e.At.UTC())
		}
	}
	step(40, true)
	step(45, true, used(0.5), used(0.8), below(20)) // used 85, balance 15
	_, err := l.Refund(ctx, "k", 50)                // used 35: the lines stay fired
	require.NoError(t, err)
	_, err = l.Grant(ctx, "k", 30, time.Time{}) // balance 95
	require.NoError(t, err)
	step(60, true)              // used 95, balance 35
	step(34, true, used(1))     // used 100 (the bucket), balance 1 (a grant)
	step(2, false, exhausted()) // balance 1: denied
	step(2, false)              // again: once per period
	step(1, true, below(0))     // balance 0
	evs := listEvents(t, pool, "q")
	require.Equal(t, []line{used(0.5), used(0.8), below(20), used(1), exhausted(), below(0)}, lines(evs))
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	for _, e := range evs {
		require.Equal(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), e.PeriodStart.UTC())
		require.Equal(t, feb, e.PeriodEnd.UTC())
		require.True(t, e.DeliveredAt.IsZero())
	}

	clock.Set(31*24*time.Hour + time.Hour) // 2026-02-01 13:00: a new period, the bucket full
	step(85, true, used(0.5), used(0.8), below(20))
	evs = listEvents(t, pool, "q")
	require.Equal(t, feb, evs[len(evs)-1].PeriodStart.UTC())
}

// A limiter that refills every Interval: periods of the time an empty
// bucket takes to fill, on the epoch's grid.
func TestAlertsIntervalPeriods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock()
	// 10 tokens, 3 a minute: full again after 4 minutes.
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "iv", Capacity: 10, Refill: 3, Interval: time.Minute, Clock: clock.Now,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5}}})
	charge := func(n int64) {
		_, err := l.AllowN(ctx, "k", n)
		require.NoError(t, err)
	}
	charge(5) // 12:00, used 5: fires
	clock.Add(2 * time.Minute)
	charge(6) // 12:02: refilled to 10 (capped), used 6: same period (12:00 to 12:04)
	clock.Add(2 * time.Minute)
	charge(9) // 12:04: 4 + 6 = 10, used 9: a new period
	evs := listEvents(t, pool, "iv")
	require.Len(t, evs, 2)
	require.Equal(t, t0, evs[0].PeriodStart.UTC())
	require.Equal(t, t0.Add(4*time.Minute), evs[0].PeriodEnd.UTC())
	require.Equal(t, t0.Add(4*time.Minute), evs[1].PeriodStart.UTC())
}

// Events are rows of the check's transaction: a caller's transaction that
// rolls back leaves none, one that commits leaves them; with pgx and with
// database/sql, and with a request ID recorded on the event.
func TestAlertsInCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "tx", Capacity: 10, Refill: 10, Interval: time.Hour,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5}, Exhausted: true}})
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	r, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "k", 6)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, listEvents(t, pool, "tx"))

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, &sql.TxOptions{})
	require.NoError(t, err)
	in := l.In(pgratelimit.SQLTx(stx))
	_, err = in.AllowN(pgratelimit.WithRequestID(ctx, "order-1"), "k", 6)
	require.NoError(t, err)
	r, err = in.AllowN(ctx, "k", 6) // denied: exhausted, in the same transaction
	require.NoError(t, err)
	require.False(t, r.Allowed)
	r, err = in.AllowN(ctx, "k", 6) // its state is the transaction's own: still once
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.NoError(t, stx.Commit())
	evs := listEvents(t, pool, "tx")
	require.Equal(t, []line{used(0.5), exhausted()}, lines(evs))
	require.Equal(t, "order-1", evs[0].RequestID)
	require.Equal(t, "", evs[1].RequestID)

	// A retry of the committed charge replays it: nothing fires again.
	r, err = l.AllowN(pgratelimit.WithRequestID(ctx, "order-1"), "k", 6)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Len(t, listEvents(t, pool, "tx"), 2)
}

// Every statement of alerts and events in each of pgx's query modes that
// work behind PgBouncer: fired, listed and delivered.
func TestAlertsQueryModes(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(s.URL(t) + "&default_query_exec_mode=" + mode)
			require.NoError(t, err)
			pool := s.PoolWithConfig(t, cfg)
			l := alertLimiter(t, pool, pgratelimit.Config{Prefix: mode, Capacity: 4, Refill: 4, Interval: time.Hour,
				Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5}, BalanceAtOrBelow: []int64{0}, Exhausted: true}})
			for _, cost := range []int64{2, 2, 1, 1} {
				_, err := l.AllowN(pgratelimit.WithRequestID(ctx, fmt.Sprint(mode, cost, time.Now().UnixNano())), "k", cost)
				require.NoError(t, err)
			}
			require.Equal(t, []line{used(0.5), below(0), exhausted()}, lines(listEvents(t, pool, mode)))
			c, err := events.NewConsumer(pool, events.ConsumerConfig{DisableListen: true, Prefixes: []string{mode},
				Handler: func(context.Context, pgx.Tx, events.Event) error { return nil }})
			require.NoError(t, err)
			n, err := c.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			after, err := events.List(ctx, pool, events.Filter{Prefix: mode, AfterID: 1, Since: t0.Add(-time.Hour)})
			require.NoError(t, err)
			require.NotEmpty(t, after)
		})
	}
}

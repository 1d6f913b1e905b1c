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

// A line a limiter saw fire stays fired for it, in its own transactions,
// even when the key's alert state is deleted by hand (docs/alerts.md): the
// limiter remembers what its committed transactions fired (issue 40: it
// only remembered lines it later read back, so the first denial after a
// firing, with the state deleted, fired again).
func TestAlertsRememberedAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "mem", Capacity: 10, Refill: 10,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Alerts: pgratelimit.Alerts{Exhausted: true}})
	r, err := l.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, []line{exhausted()}, lines(listEvents(t, pool, "mem")))
	_, err = pool.Exec(ctx, `DELETE FROM pgratelimit_alert_state WHERE key = 'k'`)
	require.NoError(t, err)
	r, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, []line{exhausted()}, lines(listEvents(t, pool, "mem")), "the line fired again")

	// A limiter that never saw it fire (a restart) reads the state: gone,
	// so it fires.
	fresh := alertLimiter(t, pool, l.Config())
	_, err = fresh.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, []line{exhausted(), exhausted()}, lines(listEvents(t, pool, "mem")))
}

// A balance that falls past a BalanceAtOrBelow line with no operation (a
// grant expires, a smaller plan clamps the tokens) is told by the key's next
// operation that is taken, if the balance it leaves is still at or below
// the line (docs/alerts.md; issue 40: nothing ever fired).
func TestAlertsUnseenDrops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	t.Run("grant expiry", func(t *testing.T) {
		clock := newClock()
		l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "exp", Capacity: 100, Refill: 100, Grants: true, Clock: clock.Now,
			Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Alerts: pgratelimit.Alerts{BalanceAtOrBelow: []int64{50}}})
		_, err := l.Grant(ctx, "k", 100, clock.Now().Add(24*time.Hour))
		require.NoError(t, err)
		r, err := l.AllowN(ctx, "k", 80) // bucket 20, balance 120
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Empty(t, listEvents(t, pool, "exp"))
		clock.Add(48 * time.Hour) // the grant expired: balance 20, unseen
		r, err = l.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		evs := listEvents(t, pool, "exp")
		require.Equal(t, []line{below(50)}, lines(evs))
		require.Equal(t, int64(19), evs[0].Balance)
		_, err = l.AllowN(ctx, "k", 1) // once per period
		require.NoError(t, err)
		require.Len(t, listEvents(t, pool, "exp"), 1)
	})
	t.Run("downgrade", func(t *testing.T) {
		clock := newClock()
		cfg := pgratelimit.Config{Prefix: "down", Capacity: 1000, Refill: 1000, Clock: clock.Now,
			Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Alerts: pgratelimit.Alerts{BalanceAtOrBelow: []int64{600}}}
		big := alertLimiter(t, pool, cfg)
		cfg.Capacity, cfg.Refill = 500, 500
		small := alertLimiter(t, pool, cfg)
		r, err := big.AllowN(ctx, "k", 200) // 800
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = small.AllowN(ctx, "k", 10) // clamped to 500, then 490
		require.NoError(t, err)
		require.Equal(t, int64(490), r.Remaining)
		evs := listEvents(t, pool, "down")
		require.Equal(t, []line{below(600)}, lines(evs))
		require.Equal(t, int64(490), evs[0].Balance)
	})
	t.Run("a refill is no drop", func(t *testing.T) {
		clock := newClock()
		l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "up", Capacity: 100, Refill: 100, Clock: clock.Now,
			Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Alerts: pgratelimit.Alerts{BalanceAtOrBelow: []int64{50}}})
		_, err := l.AllowN(ctx, "k", 40) // 60
		require.NoError(t, err)
		clock.Set(31 * 24 * time.Hour)  // February: full again
		_, err = l.AllowN(ctx, "k", 10) // 90
		require.NoError(t, err)
		require.Empty(t, listEvents(t, pool, "up"))
	})
}

// A transaction that fired a line and then failed to commit (here a
// deferred trigger's serialization failure, once, which the engine retries)
// teaches the limiter nothing: its retry fires the line, and the event
// exists once.
func TestAlertsFiredOnlyWhenCommitted(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "a trigger on a coordinator table")
	ctx := context.Background()
	pool := newPool(t)
	for _, ddl := range []string{
		`CREATE SEQUENCE flaky_once`,
		`CREATE FUNCTION flaky() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF nextval('flaky_once') = 1 THEN RAISE EXCEPTION 'flaky' USING ERRCODE = '40001'; END IF; RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER flaky AFTER INSERT ON pgratelimit_events DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION flaky()`,
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "rb", Capacity: 10, Refill: 10,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Alerts: pgratelimit.Alerts{Exhausted: true}})
	_, err := l.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	r, err := l.AllowN(ctx, "k", 1) // fires; its first COMMIT fails
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, []line{exhausted()}, lines(listEvents(t, pool, "rb")))
	var tries int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_value FROM flaky_once`).Scan(&tries))
	require.Equal(t, int64(2), tries, "the event's first COMMIT failed, its retry committed")
	_, err = l.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, []line{exhausted()}, lines(listEvents(t, pool, "rb")))
}

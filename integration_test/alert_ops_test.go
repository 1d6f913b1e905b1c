package integration

// Usage alerts in operation: cleanup, metrics, listing, Citus.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// Cleanup deletes the alert state of periods that have ended and events
// delivered longer ago than the retention, never undelivered ones.
func TestAlertsCleanup(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "it counts rows per table")
	ctx := context.Background()
	pool := newPool(t)
	emit(t, pool, "cl", 5)
	c, err := events.NewConsumer(pool, events.ConsumerConfig{DisableListen: true, MaxAttempts: 1,
		Handler: func(_ context.Context, _ pgx.Tx, e events.Event) error {
			if e.Key >= "k003" {
				return errors.New("no")
			}
			return nil
		}})
	require.NoError(t, err)
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 5, count(t, pool, `SELECT count(*) FROM pgratelimit_alert_state`))

	// Now, with the default retention: nothing to delete.
	_, err = deleteExpired(ctx, pool, pgratelimit.CleanerConfig{})
	require.NoError(t, err)
	require.Equal(t, 5, count(t, pool, `SELECT count(*) FROM pgratelimit_events`))
	require.Equal(t, 5, count(t, pool, `SELECT count(*) FROM pgratelimit_alert_state`))

	// A year on: the periods have ended, the delivered events are old.
	later := time.Now().AddDate(1, 0, 0)
	_, err = deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: func() time.Time { return later }})
	require.NoError(t, err)
	require.Zero(t, count(t, pool, `SELECT count(*) FROM pgratelimit_alert_state`))
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM pgratelimit_events WHERE delivered_at IS NULL`))
	require.Equal(t, 2, count(t, pool, `SELECT count(*) FROM pgratelimit_events`))

	_, err = deleteExpired(ctx, pool, pgratelimit.CleanerConfig{EventRetention: -time.Second})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// pgratelimit.events.emitted and pgratelimit.events.delivered count by
// prefix and kind.
func TestAlertsMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	pool := newPool(t)
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "mt", Capacity: 2, Refill: 2, Interval: time.Hour, MeterProvider: mp,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5, 1}, Exhausted: true}})
	for range 3 {
		_, err := l.Allow(ctx, "k")
		require.NoError(t, err)
	}
	c, err := events.NewConsumer(pool, events.ConsumerConfig{DisableListen: true, MeterProvider: mp,
		Handler: func(context.Context, pgx.Tx, events.Event) error { return nil }})
	require.NoError(t, err)
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]map[[2]string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != "pgratelimit.events.emitted" && mt.Name != "pgratelimit.events.delivered" {
				continue
			}
			require.Equal(t, "{event}", mt.Unit)
			got[mt.Name] = map[[2]string]int64{}
			for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
				p, _ := dp.Attributes.Value("pgratelimit.prefix")
				k, _ := dp.Attributes.Value("pgratelimit.event.kind")
				got[mt.Name][[2]string{p.AsString(), k.AsString()}] += dp.Value
			}
		}
	}
	want := map[[2]string]int64{{"mt", "used"}: 2, {"mt", "exhausted"}: 1}
	require.Equal(t, map[string]map[[2]string]int64{"pgratelimit.events.emitted": want, "pgratelimit.events.delivered": want}, got)
}

// events.List: the newest events, newest last; with AfterID the oldest after
// it; filters by prefix, key and time; bad filters refused.
func TestListEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	emit(t, pool, "le", 5)
	emit(t, pool, "other", 2)
	all := listEvents(t, pool, "le")
	require.Len(t, all, 5)
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i-1].ID, all[i].ID)
	}
	last2, err := events.List(ctx, pool, events.Filter{Prefix: "le", Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{all[3].ID, all[4].ID}, []int64{last2[0].ID, last2[1].ID}, "the newest, newest last")
	after, err := events.List(ctx, pool, events.Filter{Prefix: "le", AfterID: all[1].ID, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []int64{all[2].ID, all[3].ID}, []int64{after[0].ID, after[1].ID}, "the oldest after AfterID")
	one, err := events.List(ctx, pool, events.Filter{Prefix: "le", Key: "k002"})
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, "k002", one[0].Key)
	everything, err := events.List(ctx, pool, events.Filter{})
	require.NoError(t, err)
	require.Len(t, everything, 7)
	none, err := events.List(ctx, pool, events.Filter{Since: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, none)
	for _, f := range []events.Filter{{Limit: -1}, {Limit: 10001}, {Prefix: "a\x00"}} {
		_, err := events.List(ctx, pool, f)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument, "%+v", f)
	}
	_, err = events.List(ctx, pool, events.Filter{Key: "\xff"})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
}

// On Citus (PGRATELIMIT_TEST_CITUS_URL): the alert tables stay on the
// coordinator; a charge through it fires once, and a consumer delivers.
func TestAlertsOnCitus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusPool(t, 8)
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "ct", Capacity: 10, Refill: 10, Interval: time.Hour,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5}, Exhausted: true}})
	for _, cost := range []int64{6, 3, 6, 6} {
		_, err := l.AllowN(ctx, "k", cost)
		require.NoError(t, err)
	}
	require.Equal(t, []line{used(0.5), exhausted()}, lines(listEvents(t, pool, "ct")))
	c, err := events.NewConsumer(pool, events.ConsumerConfig{DisableListen: true,
		Handler: func(context.Context, pgx.Tx, events.Event) error { return nil }})
	require.NoError(t, err)
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

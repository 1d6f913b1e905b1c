package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The instruments count a known sequence of allowed, denied, refused
// (invalid input) and failed checks exactly, with the limiter's prefix, in
// both coalescing modes.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	pool := newPool(t)
	cfg := pgratelimit.Config{Prefix: "m", Capacity: 3, Refill: 1, Interval: time.Hour, MeterProvider: mp}
	l, err := newLimiterOn(pool, cfg)
	require.NoError(t, err)
	day, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "d", Capacity: 100, Refill: 1, Interval: time.Hour, MeterProvider: mp})
	require.NoError(t, err)
	cfg.Prefix = "unmigrated"
	broken, err := newLimiterOn(testdb.NewEmptySchema(t).Pool(t, 0), cfg)
	require.NoError(t, err)

	for range 4 { // 3 allowed, 1 denied
		_, err := l.Allow(ctx, "k")
		require.NoError(t, err)
	}
	// The caller's input refused: "invalid", not the limiter failing.
	_, err = l.AllowN(ctx, "k", 0)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidCost)
	_, err = l.AllowN(ctx, "k", 4)
	require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
	_, err = l.Allow(ctx, "")
	require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
	_, err = broken.Allow(ctx, "k") // the database's error
	require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)
	// AllowAll counts one check per charge, each with its own prefix.
	m, err := pgratelimit.AllowAll(ctx, day.Charge("k", 1), l.Charge("k", 1))
	require.NoError(t, err)
	require.False(t, m.Allowed)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	checks := map[[2]string]int64{}
	durations := map[[2]string]uint64{}
	var batched int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch mt.Name {
			case "pgratelimit.checks":
				require.Equal(t, "{check}", mt.Unit)
				for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					checks[key2(dp.Attributes)] += dp.Value
				}
			case "pgratelimit.check.duration":
				require.Equal(t, "s", mt.Unit)
				for _, dp := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
					durations[key2(dp.Attributes)] += dp.Count
				}
			case "pgratelimit.batch.size":
				for _, dp := range mt.Data.(metricdata.Histogram[int64]).DataPoints {
					batched += dp.Sum
				}
			}
		}
	}
	want := map[[2]string]int64{
		{"m", "allowed"}: 3, {"m", "denied"}: 2, {"m", "invalid"}: 3,
		{"d", "denied"}: 1, {"unmigrated", "error"}: 1,
	}
	require.Equal(t, want, checks)
	for k, n := range want {
		require.Equal(t, uint64(n), durations[k], "durations of %v", k)
	}
	if perCheck {
		require.Zero(t, batched, "no coalesced transactions")
	} else {
		require.Equal(t, int64(6), batched, "every check that reached a database went through a coalescer")
	}
}

func key2(s attribute.Set) [2]string {
	p, _ := s.Value("pgratelimit.prefix")
	r, _ := s.Value("pgratelimit.result")
	return [2]string{p.AsString(), r.AsString()}
}

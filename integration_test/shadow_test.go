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

// Checks made with pgratelimit.WithShadow are counted with
// pgratelimit.shadow=true, in both instruments, whatever their result; other
// checks keep their attribute sets without it; and a shadowed check spends
// exactly what an enforced one would.
func TestShadowMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	shadow := pgratelimit.WithShadow(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := pgratelimit.Config{Prefix: "s", Capacity: 2, Refill: 1, Interval: time.Hour, MeterProvider: mp}
	l, err := newLimiterOn(newPool(t), cfg)
	require.NoError(t, err)
	cfg.Prefix = "unmigrated"
	broken, err := newLimiterOn(testdb.NewEmptySchema(t).Pool(t, 0), cfg)
	require.NoError(t, err)

	r, err := l.Allow(shadow, "k") // allowed, shadowed
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(1), r.Remaining, "a shadowed check takes its tokens as an enforced one does")
	r, err = l.Allow(ctx, "k") // allowed
	require.NoError(t, err)
	require.True(t, r.Allowed)
	for range 2 { // denied, shadowed: nothing written
		r, err = l.Allow(shadow, "k")
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Zero(t, r.Remaining)
	}
	r, err = l.Allow(ctx, "k") // denied
	require.NoError(t, err)
	require.False(t, r.Allowed)
	_, err = l.AllowN(shadow, "k", 0) // invalid input, shadowed
	require.ErrorIs(t, err, pgratelimit.ErrInvalidCost)
	_, err = broken.Allow(shadow, "k") // the database's error, shadowed
	require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	type point struct {
		prefix, result string
		shadow         bool
	}
	pointOf := func(s attribute.Set) point {
		p, _ := s.Value("pgratelimit.prefix")
		r, _ := s.Value("pgratelimit.result")
		sh, ok := s.Value("pgratelimit.shadow")
		require.True(t, !ok || sh.AsBool(), "pgratelimit.shadow is true or absent: %v", s)
		require.Equal(t, 2+btoi(ok), s.Len(), "no other attributes: %v", s)
		return point{p.AsString(), r.AsString(), ok}
	}
	checks := map[point]int64{}
	durations := map[point]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch mt.Name {
			case "pgratelimit.checks":
				for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					checks[pointOf(dp.Attributes)] += dp.Value
				}
			case "pgratelimit.check.duration":
				for _, dp := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
					durations[pointOf(dp.Attributes)] += dp.Count
				}
			}
		}
	}
	want := map[point]int64{
		{"s", "allowed", true}: 1, {"s", "allowed", false}: 1,
		{"s", "denied", true}: 2, {"s", "denied", false}: 1,
		{"s", "invalid", true}: 1, {"unmigrated", "error", true}: 1,
	}
	require.Equal(t, want, checks)
	wantDurations := map[point]uint64{}
	for k, n := range want {
		wantDurations[k] = uint64(n)
	}
	require.Equal(t, wantDurations, durations)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

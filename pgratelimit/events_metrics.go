package pgratelimit

import (
	"context"

	"github.com/pgratelimit/pgratelimit/internal/alert"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// eventInstruments count usage alert events, by limiter prefix and kind
// (few of each: never a key).
type eventInstruments struct {
	emittedCount metric.Int64Counter
}

func newEventInstruments(mp metric.MeterProvider) *eventInstruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	in := &eventInstruments{}
	// As in newInstruments: a refused instrument is a working no-op.
	in.emittedCount, _ = m.Int64Counter("pgratelimit.events.emitted", metric.WithUnit("{event}"),
		metric.WithDescription("Usage alert events written by checks' transactions, by limiter prefix and kind (used, below, exhausted); counted when the database confirms the write, before COMMIT."))
	return in
}

func eventAttrs(prefix, kind string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		attribute.String("pgratelimit.prefix", prefix), attribute.String("pgratelimit.event.kind", kind)))
}

// emitted counts an event written.
func (in *eventInstruments) emitted(ctx context.Context, prefix string, k alert.Kind) {
	in.emittedCount.Add(ctx, 1, eventAttrs(prefix, k.String()))
}

package pgratelimit

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instruments are a limiter's OpenTelemetry instruments, with the attribute
// sets of its results made once, so recording allocates nothing.
type instruments struct {
	checks   metric.Int64Counter
	duration metric.Float64Histogram
	batch    metric.Int64Histogram
	// The attribute set of each result, as the option lists Add and Record
	// take (passed whole, so a call allocates no list), and the same with
	// pgratelimit.shadow=true for the checks of WithShadow contexts.
	allowed, denied, errored outcome
	shadow                   struct{ allowed, denied, errored outcome }
	// seen is batchSize as a func value, made once (a method value
	// allocates at each use).
	seen func(ctx context.Context, n int)
	// overridesSet and overridesCleared count SetOverride and
	// ClearOverride, by prefix (prefixAttr).
	overridesSet, overridesCleared metric.Int64Counter
	prefixAttr                     []metric.AddOption
}

type outcome struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

const meterName = "github.com/pgratelimit/pgratelimit"

func newInstruments(mp metric.MeterProvider, prefix string) *instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	in := &instruments{}
	// The API returns a working no-op instrument along with any error, so
	// a provider that refuses one only loses that instrument.
	in.checks, _ = m.Int64Counter("pgratelimit.checks", metric.WithUnit("{check}"),
		metric.WithDescription("Checks decided, one per charge of AllowAll, by limiter prefix and result (allowed, denied, error)."))
	in.duration, _ = m.Float64Histogram("pgratelimit.check.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a check took, from the call to its result, by limiter prefix and result."))
	in.batch, _ = m.Int64Histogram("pgratelimit.batch.size", metric.WithUnit("{check}"),
		metric.WithDescription("Checks per coalesced transaction."))
	set := func(result string, extra ...attribute.KeyValue) outcome {
		o := metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{
			attribute.String("pgratelimit.prefix", prefix),
			attribute.String("pgratelimit.result", result)}, extra...)...))
		return outcome{[]metric.AddOption{o}, []metric.RecordOption{o}}
	}
	in.allowed, in.denied, in.errored = set("allowed"), set("denied"), set("error")
	shadow := attribute.Bool("pgratelimit.shadow", true)
	in.shadow.allowed, in.shadow.denied, in.shadow.errored = set("allowed", shadow), set("denied", shadow), set("error", shadow)
	in.seen = in.batchSize
	in.overridesSet, _ = m.Int64Counter("pgratelimit.overrides.set", metric.WithUnit("{override}"),
		metric.WithDescription("Overrides set (SetOverride), by limiter prefix."))
	in.overridesCleared, _ = m.Int64Counter("pgratelimit.overrides.cleared", metric.WithUnit("{override}"),
		metric.WithDescription("Overrides cleared (ClearOverride), by limiter prefix."))
	in.prefixAttr = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("pgratelimit.prefix", prefix)))}
	return in
}

// outcomes are the attribute sets of a check made with ctx: the shadow ones
// for a WithShadow context.
func (in *instruments) outcomes(ctx context.Context) (allowed, denied, errored outcome) {
	if isShadow(ctx) {
		return in.shadow.allowed, in.shadow.denied, in.shadow.errored
	}
	return in.allowed, in.denied, in.errored
}

func (in *instruments) batchSize(ctx context.Context, n int) {
	in.batch.Record(ctx, int64(n))
}

// record counts a finished call: one check per charge, each recorded by its
// own limiter, with pgratelimit.shadow=true when ctx comes from WithShadow.
// (A context that has ended does not stop a measurement: the API records
// regardless of it.)
func record(ctx context.Context, start time.Time, m MultiResult, err error, charges []Charge) {
	secs := time.Since(start).Seconds()
	for _, c := range charges {
		in := c.lim.metrics
		allowed, denied, attrs := in.outcomes(ctx)
		switch {
		case err != nil:
		case m.Allowed:
			attrs = allowed
		default:
			attrs = denied
		}
		in.checks.Add(ctx, 1, attrs.add...)
		in.duration.Record(ctx, secs, attrs.record...)
	}
}

// recordInvalid counts a call refused for its input as an error of each
// charge that has a limiter.
func recordInvalid(ctx context.Context, start time.Time, charges []Charge) {
	secs := time.Since(start).Seconds()
	for _, c := range charges {
		if l := c.lim; l != nil {
			_, _, errored := l.metrics.outcomes(ctx)
			l.metrics.checks.Add(ctx, 1, errored.add...)
			l.metrics.duration.Record(ctx, secs, errored.record...)
		}
	}
}

// cleanupCounter is the counter of rows deleted by cleanup.
func cleanupCounter(mp metric.MeterProvider) metric.Int64Counter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	c, _ := mp.Meter(meterName).Int64Counter("pgratelimit.cleanup.deleted", metric.WithUnit("{row}"),
		metric.WithDescription("Expired bucket rows deleted by cleanup."))
	return c
}

// recordDenied counts a check that the deny cache denied, started at start.
func (in *instruments) recordDenied(ctx context.Context, start time.Time) {
	_, denied, _ := in.outcomes(ctx)
	in.checks.Add(ctx, 1, denied.add...)
	in.duration.Record(ctx, time.Since(start).Seconds(), denied.record...)
}

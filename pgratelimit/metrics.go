package pgratelimit

import (
	"context"
	"errors"
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
	plain, shadow results
	// seen is batchSize as a func value, made once (a method value
	// allocates at each use).
	seen func(ctx context.Context, n int)
}

type outcome struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// results are the attribute sets of the results: allowed, denied, invalid
// (the caller's input refused: isInvalid) and error (the limiter failing).
type results struct{ allowed, denied, invalid, errored outcome }

// isInvalid says err refuses the caller's input (a bad key, cost or request
// ID, a cost above capacity, a request ID reused for another call), which
// the metrics count as result "invalid", apart from the limiter failing
// ("error").
func isInvalid(err error) bool {
	for _, e := range []error{ErrInvalidKey, ErrInvalidCost, ErrCostExceedsCapacity, ErrInvalidRequestID, ErrRequestMismatch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
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
		metric.WithDescription("Checks decided, one per charge of AllowAll, by limiter prefix and result (allowed, denied, invalid: the caller's input refused, error: the limiter failing)."))
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
	sets := func(extra ...attribute.KeyValue) results {
		return results{set("allowed", extra...), set("denied", extra...), set("invalid", extra...), set("error", extra...)}
	}
	in.plain, in.shadow = sets(), sets(attribute.Bool("pgratelimit.shadow", true))
	in.seen = in.batchSize
	return in
}

// outcomes are the attribute sets of a check made with ctx: the shadow ones
// for a WithShadow context.
func (in *instruments) outcomes(ctx context.Context) results {
	if isShadow(ctx) {
		return in.shadow
	}
	return in.plain
}

func (in *instruments) batchSize(ctx context.Context, n int) {
	in.batch.Record(ctx, int64(n))
}

// record counts a finished call (or one refused before any database
// access): one check per charge with a Limiter, each recorded by its own
// limiter, with pgratelimit.shadow=true when ctx comes from WithShadow.
// (A context that has ended does not stop a measurement: the API records
// regardless of it.)
func record(ctx context.Context, start time.Time, m MultiResult, err error, charges []Charge) {
	secs := time.Since(start).Seconds()
	for _, c := range charges {
		if c.lim == nil {
			continue // a Semaphore's: its own instruments
		}
		in := c.lim.metrics
		rs := in.outcomes(ctx)
		var attrs outcome
		switch {
		case err != nil && isInvalid(err):
			attrs = rs.invalid
		case err != nil:
			attrs = rs.errored
		case m.Allowed:
			attrs = rs.allowed
		default:
			attrs = rs.denied
		}
		in.checks.Add(ctx, 1, attrs.add...)
		in.duration.Record(ctx, secs, attrs.record...)
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
	denied := in.outcomes(ctx).denied
	in.checks.Add(ctx, 1, denied.add...)
	in.duration.Record(ctx, time.Since(start).Seconds(), denied.record...)
}

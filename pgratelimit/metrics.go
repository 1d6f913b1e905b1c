package pgratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/alert"
	"github.com/pgratelimit/pgratelimit/internal/lease"
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
	// overridesSet and overridesCleared count SetOverride and
	// ClearOverride, by prefix (prefixAttr).
	overridesSet, overridesCleared metric.Int64Counter
	prefixAttr                     []metric.AddOption
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
	in.overridesSet, _ = m.Int64Counter("pgratelimit.overrides.set", metric.WithUnit("{override}"),
		metric.WithDescription("Overrides set (SetOverride), by limiter prefix."))
	in.overridesCleared, _ = m.Int64Counter("pgratelimit.overrides.cleared", metric.WithUnit("{override}"),
		metric.WithDescription("Overrides cleared (ClearOverride), by limiter prefix."))
	in.prefixAttr = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("pgratelimit.prefix", prefix)))}
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

// leaseInstruments are a semaphore's OpenTelemetry instruments, with its
// attribute set (the prefix alone: keys would be unbounded) made once, and
// the leases it counts as held, so that each is counted once however often
// it is replayed or released. While held records nothing (no
// MeterProvider installed) it keeps no lease: a sync.Map entry per
// acquisition and its lookup at each release would cost more than
// anything else a lease's client side does in Go.
type leaseInstruments struct {
	held   metric.Int64UpDownCounter
	denied metric.Int64Counter
	add    []metric.AddOption
	leases sync.Map     // heldLease -> weight
	n      atomic.Int64 // entries of leases, counted before they are stored
}

// heldLease names a lease this process holds.
type heldLease struct{ key, id string }

func newLeaseInstruments(mp metric.MeterProvider, prefix string) *leaseInstruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	in := &leaseInstruments{add: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("pgratelimit.prefix", prefix)))}}
	// As for a limiter's: a provider that refuses one only loses it.
	in.held, _ = m.Int64UpDownCounter("pgratelimit.leases.held", metric.WithUnit("{unit}"),
		metric.WithDescription("Units held by the leases this process acquired and has not released, by semaphore prefix "+
			"(one that expired unreleased counts until its Release)."))
	in.denied, _ = m.Int64Counter("pgratelimit.leases.denied", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Lease acquisitions denied for want of free units, by semaphore prefix."))
	return in
}

// record counts the outcome out of an acquisition on key: its units held
// when acquired (once per lease), a denial otherwise.
func (in *leaseInstruments) record(ctx context.Context, key string, acquired bool, out lease.Outcome) {
	if !acquired {
		in.denied.Add(ctx, 1, in.add...)
		return
	}
	if !in.held.Enabled(ctx) {
		return // nothing would count it, nor its release
	}
	in.n.Add(1)
	if _, had := in.leases.LoadOrStore(heldLease{key, out.Lease.ID}, out.Lease.Weight); had {
		in.n.Add(-1)
	} else {
		in.held.Add(ctx, out.Lease.Weight, in.add...)
	}
}

// released counts lease id of key released (or found expired) by this
// process.
func (in *leaseInstruments) released(ctx context.Context, key, id string) {
	if in.n.Load() == 0 {
		return // none held: no need to look
	}
	if w, had := in.leases.LoadAndDelete(heldLease{key, id}); had {
		in.n.Add(-1)
		in.held.Add(ctx, -w.(int64), in.add...)
	}
}

// shadowKey marks a context made by WithShadow.
type shadowKey struct{}

// WithShadow returns a copy of ctx that marks the checks made with it as
// shadow checks: checks of a limit being rolled out, whose answer the caller
// logs but does not enforce (the Config.Shadow of httplimit, grpclimit and
// connectlimit makes their checks this way). Such checks
// are recorded with the attribute pgratelimit.shadow=true in
// pgratelimit.checks and pgratelimit.check.duration, so a dashboard can tell
// the would-be denials of a shadowed limit from the denials of enforced ones.
// Nothing else changes: the check runs, an allowed check takes its tokens and
// a denied one writes nothing, exactly as without it.
func WithShadow(ctx context.Context) context.Context {
	return context.WithValue(ctx, shadowKey{}, true)
}

// isShadow reports whether ctx was made by WithShadow.
func isShadow(ctx context.Context) bool {
	v, _ := ctx.Value(shadowKey{}).(bool)
	return v
}

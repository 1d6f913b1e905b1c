package pgratelimit

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgratelimit/pgratelimit/internal/lease"
)

// leaseInstruments are a semaphore's OpenTelemetry instruments, with its
// attribute set (the prefix alone: keys would be unbounded) made once, and
// the leases it counts as held, so that each is counted once however often
// it is replayed or released.
type leaseInstruments struct {
	held   metric.Int64UpDownCounter
	denied metric.Int64Counter
	add    []metric.AddOption
	leases sync.Map // heldLease -> weight
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
	if _, had := in.leases.LoadOrStore(heldLease{key, out.Lease.ID}, out.Lease.Weight); !had {
		in.held.Add(ctx, out.Lease.Weight, in.add...)
	}
}

// released counts lease id of key released (or found expired) by this
// process.
func (in *leaseInstruments) released(ctx context.Context, key, id string) {
	if w, had := in.leases.LoadAndDelete(heldLease{key, id}); had {
		in.held.Add(ctx, -w.(int64), in.add...)
	}
}

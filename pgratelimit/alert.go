package pgratelimit

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/alert"
)

// Alerts are a limiter's usage alerts: lines across a key's balance that
// write an event (see package events: events.Event) in the transaction of the charge that crosses
// one, so that the event exists if and only if its charge committed. Each
// line fires at most once per key and period: when a charge first crosses
// it. A refund or a grant that lifts the balance back above a line does not
// re-arm it within the period; the next period does. A key that starts a
// period already past a line (unused credits rolled over, a debt) is told
// only when a charge crosses it again.
//
// The period is, for a limiter with a Calendar, the calendar period
// between two boundaries (the key's own with WithAnchor); for a limiter
// that refills every Interval, the time an empty bucket takes to fill,
// ceil(Capacity/Refill) intervals, on the epoch's grid ("per refill to
// full": Capacity 1000, Refill 10 every second: periods of 100 seconds).
//
// Limiters that share a Prefix share a key's alert state (a line is known
// by its value, so plans that draw the same lines agree on what has fired).
// Alerts need Storage Durable. The zero value draws no line.
type Alerts struct {
	// UsedFractions fire when the fraction of Capacity the bucket has used
	// (Capacity minus its tokens, grants not counted) reaches or passes
	// each: 0.8 fires on the charge that takes a bucket of 1000 from
	// fewer than 800 used to 800 or more. Each in (0, 1]. Defaults to none.
	UsedFractions []float64

	// BalanceAtOrBelow fire when the key's balance (bucket tokens plus live
	// grants) falls from above each level to it or below: 100 fires on the
	// charge that takes a balance of 120 to 100 or less; 0 when the balance
	// is spent. A balance that falls with no operation (a grant expires, a
	// smaller Capacity clamps the tokens) is told by the key's next
	// operation that is taken, if the balance it leaves is still at or
	// below the level. Each >= 0. Defaults to none.
	BalanceAtOrBelow []int64

	// Exhausted fires when a charge (AllowN, AllowAll, Wait) is denied
	// because the key's balance does not cover its cost: "the customer hit
	// the wall", once per period. Defaults to false.
	Exhausted bool
}

// thresholds are a's lines in the alert package's words.
func (a Alerts) thresholds() alert.Thresholds {
	return alert.Thresholds{Used: a.UsedFractions, Below: a.BalanceAtOrBelow, Exhausted: a.Exhausted}
}

// validate says why a is not valid on a limiter of storage s, naming the
// field, or "".
func (a Alerts) validate(s Storage) string {
	t := a.thresholds()
	if err := t.Validate(); err != nil {
		return "Alerts." + err.Error()
	}
	if !t.Empty() && s != Durable {
		return "Alerts need Storage Durable: their state and events are kept in logged tables, beside the balances they watch"
	}
	return ""
}

// newAlertObserver is the observer of cfg's alerts, or nil when it has
// none.
func newAlertObserver(cfg Config) *alert.Observer {
	t := cfg.Alerts.thresholds()
	if t.Empty() {
		return nil
	}
	var window time.Duration
	if cfg.Calendar == (Calendar{}) {
		window = alert.Window(cfg.Capacity, cfg.Refill, cfg.Interval)
	}
	m := newEventInstruments(cfg.MeterProvider)
	return alert.New(alert.Config{Spec: alert.Compile(t, cfg.Capacity), Window: window, Emitted: m.emitted})
}

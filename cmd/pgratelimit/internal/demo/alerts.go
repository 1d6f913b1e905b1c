package demo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// creditsAlerts are the credits scenario's usage alerts: half, 80% and all
// of the monthly quota used, a balance (quota and grants) of 20 or less,
// and a charge denied.
var creditsAlerts = pgratelimit.Alerts{UsedFractions: []float64{0.5, 0.8, 1}, BalanceAtOrBelow: []int64{20}, Exhausted: true}

// recentAlerts is how many of a key's latest alerts the credits card shows.
const recentAlerts = 10

// alertJSON is one of a key's usage alerts, for the credits card: an event
// of pgratelimit_events, pending until the demo's consumer delivers it.
type alertJSON struct {
	ID        int64  `json:"id"`
	Kind      string `json:"kind"`
	Text      string `json:"text"` // what happened, in words
	Balance   int64  `json:"balance"`
	At        string `json:"at"` // RFC 3339
	Delivered bool   `json:"delivered"`
	Attempts  int    `json:"attempts"`
}

// creditsAlertsOf returns key's latest alerts, newest last.
func (a *app) creditsAlertsOf(ctx context.Context, key string) ([]alertJSON, error) {
	evs, err := events.List(ctx, a.pool, events.Filter{Prefix: creditsPrefix, Key: key, Limit: recentAlerts})
	if err != nil {
		return nil, err
	}
	out := make([]alertJSON, len(evs))
	for i, e := range evs {
		out[i] = alertJSON{ID: e.ID, Kind: string(e.Kind), Text: alertText(e), Balance: e.Balance,
			At: e.At.UTC().Format(time.RFC3339Nano), Delivered: !e.DeliveredAt.IsZero(), Attempts: e.Attempts}
	}
	return out, nil
}

// alertText says what an event of the credits limiter means.
func alertText(e events.Event) string {
	switch e.Kind {
	case events.Used:
		return human.Percent(e.Fraction) + " of the monthly quota used"
	case events.Below:
		return fmt.Sprintf("balance at or below %d (quota and grants)", e.Level)
	case events.Exhausted:
		return "a charge denied: the quota and grants could not cover it"
	}
	return string(e.Kind)
}

// startConsumer runs a Consumer of the credits limiter's events until stop
// is called. Its handler logs each event, where an app would send an email
// or enqueue a job; the card sees the event delivered. It delivers only
// the demo's prefix: the database may be an app's own, with consumers of
// its own.
func (a *app) startConsumer(ctx context.Context) (stop func(), err error) {
	c, err := events.NewConsumer(a.pool, events.ConsumerConfig{
		Prefixes:      []string{creditsPrefix},
		Logger:        a.log,
		MeterProvider: a.mp,
		Handler: func(ctx context.Context, _ pgx.Tx, e events.Event) error {
			a.log.InfoContext(ctx, "usage alert delivered", "id", e.ID, "key", e.Key, "alert", alertText(e), "balance", e.Balance)
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) }) // (Run returns nil when ctx ends)
	return func() {
		cancel()
		wg.Wait()
	}, nil
}

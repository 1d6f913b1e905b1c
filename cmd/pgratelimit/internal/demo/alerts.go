package demo

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// creditsAlerts are the credits scenario's usage alerts: half, 80% and all
// of the monthly quota used, a balance (quota and grants) of 20 or less,
// and a charge denied.
var creditsAlerts = pgratelimit.Alerts{UsedFractions: []float64{0.5, 0.8, 1}, BalanceAtOrBelow: []int64{20}, Exhausted: true}

// startConsumer runs a Consumer of the credits limiter's events until stop
// is called. Its handler logs each event, where an app would send an email
// or enqueue a job; the operator UI shows the event delivered. It delivers
// only the demo's prefix: the database may be an app's own, with consumers
// of its own.
func (a *app) startConsumer(ctx context.Context) (stop func(), err error) {
	c, err := events.NewConsumer(a.pool, events.ConsumerConfig{
		Prefixes: []string{creditsPrefix},
		Logger:   a.log,
		Handler: func(ctx context.Context, _ pgx.Tx, e events.Event) error {
			a.log.InfoContext(ctx, "usage alert delivered", "id", e.ID, "key", e.Key, "kind", e.Kind, "fraction", e.Fraction, "level", e.Level, "balance", e.Balance)
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

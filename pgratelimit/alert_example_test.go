package pgratelimit_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Usage alerts: tell a customer at 80% and 100% of their monthly quota,
// when their quota and credits fall to 100 or below, and when a call is
// denied. The events are written in the transactions of the charges that
// cross the lines; a Consumer in every app instance delivers them to a
// handler, here one that writes a row of the application's own table in
// the consumer's transaction (so the row exists exactly when the event is
// marked delivered). With River, the handler would enqueue a job in that
// transaction instead.
func Example_alerts() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	quota, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "calls", Capacity: 1000, Refill: 1000,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		Grants:   true,
		Alerts: pgratelimit.Alerts{
			UsedFractions:    []float64{0.8, 1}, // of the month's 1000
			BalanceAtOrBelow: []int64{100},      // the quota left plus credits granted
			Exhausted:        true,              // a call denied: the wall
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	consumer, err := pgratelimit.NewConsumer(pool, pgratelimit.ConsumerConfig{
		Handler: func(ctx context.Context, tx pgx.Tx, e pgratelimit.Event) error {
			// In the consumer's transaction: this row commits exactly when
			// the event is marked delivered (e.ID is stable, for work done
			// outside the database).
			_, err := tx.Exec(ctx, `INSERT INTO alert_emails (event_id, customer, kind, balance)
				VALUES ($1, $2, $3, $4)`, e.ID, e.Key, e.Kind, e.Balance)
			// With River, enqueue a job in the same transaction instead:
			//   _, err := riverClient.InsertTx(ctx, tx, AlertEmailArgs{EventID: e.ID, Customer: e.Key}, nil)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithTimeout(ctx, time.Minute) // in a service: until shutdown
	defer stop()
	go func() { _ = consumer.Run(ctx) }() // in every app instance: they share the work

	// The charge that takes customer-42 past 800 used writes the "used 0.8"
	// event in its own transaction.
	if _, err := quota.AllowN(ctx, "customer-42", 10); err != nil {
		log.Fatal(err)
	}

	// The events, newest last (the CLI: pgratelimit events --follow).
	events, err := pgratelimit.ListEvents(ctx, pool, pgratelimit.EventFilter{Prefix: "calls", Limit: 20})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range events {
		log.Printf("%s %s: %s at %v/%d, balance %d", e.At.Format(time.RFC3339), e.Key, e.Kind, e.Fraction, e.Level, e.Balance)
	}
}

package events_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// Usage alerts: tell a customer at 80% and 100% of their monthly quota,
// when their quota and credits fall to 100 or below, and when a call is
// denied. The events are written in the transactions of the charges that
// cross the lines; a Consumer in every app instance delivers them to a
// handler, here one that writes a row of the application's own table in
// the consumer's transaction (so the row exists exactly when the event is
// marked delivered). With River, the handler would enqueue a job in that
// transaction instead.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	if err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	db.Close()
	// The application's own table, which the handler below writes.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS alert_emails (
		event_id bigint PRIMARY KEY, customer text NOT NULL, kind text NOT NULL, balance bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	quota, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "quota", Capacity: 1000, Refill: 1000,
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

	consumer, err := events.NewConsumer(pool, events.ConsumerConfig{
		Handler: func(ctx context.Context, tx pgx.Tx, e events.Event) error {
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

	// 850 calls' worth: the charge that takes customer-42 past 80% of the
	// month writes the "used 0.8" event in its own transaction.
	if _, err := quota.AllowN(ctx, "customer-42", 850); err != nil {
		log.Fatal(err)
	}
	// In a service, every instance runs the consumer until shutdown
	// (go consumer.Run(ctx)): they share the work. Here, deliver what is
	// due now.
	if _, err := consumer.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}
	var customer, kind string
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT customer, kind, balance FROM alert_emails`).Scan(&customer, &kind, &balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println(customer, kind, balance)

	// The events, newest last (the CLI: pgratelimit events --follow).
	list, err := events.List(ctx, pool, events.Filter{Prefix: "quota", Limit: 20})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range list {
		fmt.Println(e.Key, e.Kind, e.Fraction, e.Balance, !e.DeliveredAt.IsZero())
	}
	// Output:
	// customer-42 used 150
	// customer-42 used 0.8 150 true
}

package pgratelimit_test

// The README's examples: each function below is a block of README.md, as it
// is here (internal/readme's tests check that they match, and run the
// README's blocks as a reader pastes them). go test runs them here too,
// each against a fresh schema, and checks their output.

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

func Example_credits() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "credits", Capacity: 500, Refill: 500, // 500 a month, renewed on the 1st
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		Grants:   true, // credits bought, spent after the month's
		Ledger:   true, // a row per change: credits.Ledger(ctx, key, since), or SQL
	})
	if err != nil {
		log.Fatal(err)
	}
	// A pack of 1000, granted once however often the payment's webhook retries.
	paid := pgratelimit.WithRequestID(ctx, "payment-311")
	for range 2 {
		if _, err := credits.Grant(paid, "customer-42", 1000, time.Time{}); err != nil {
			log.Fatal(err)
		}
	}
	// An LLM call: charge an estimate (once per request ID), then settle.
	call := pgratelimit.WithRequestID(ctx, "completion-77")
	est, err := credits.AllowN(call, "customer-42", 800)
	if err != nil {
		log.Fatal(err)
	}
	if !est.Allowed {
		fmt.Println("out of credits")
		return
	}
	fmt.Println("estimate: month", est.Remaining, "packs", est.Granted)
	res, err := credits.Settle(call, "customer-42", "completion-77", 620)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("settled: month", res.Remaining, "packs", res.Granted) // 180 back to the pack
	// Output:
	// estimate: month 0 packs 700
	// settled: month 0 packs 880
}

func Example_severalLimits() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	perMinute, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "reports-minute", Capacity: 10, Refill: 10, Interval: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	perDay, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "reports-day", Capacity: 12, Refill: 12, Interval: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	// A report costs 1 of the minute's 10 and 5 of the day's 12, charged in
	// the transaction that writes it: all or nothing, only if it commits, and
	// once per report however often its request is retried.
	ctx = pgratelimit.WithRequestID(ctx, "report-1001")
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := pgratelimit.PgxTx(tx).AllowAll(ctx,
		perMinute.Charge("customer-42", 1),
		perDay.Charge("customer-42", 5),
	)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("limited; day allows:", res.Results[1].Allowed)
		return
	}
	// ... the report's own writes in tx ...
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("left:", res.Results[0].Remaining, "this minute,", res.Results[1].Remaining, "today")
	// Output: left: 9 this minute, 7 today
}

func ExampleSemaphore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	exports, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{
		Prefix: "exports", Max: 2, TTL: 30 * time.Second, // at most 2 at once per organization
	})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		res, err := exports.Acquire(ctx, "org-42", 1)
		if err != nil {
			log.Fatal(err)
		}
		if !res.Allowed { // no free slot: a result, not an error
			fmt.Printf("%d of %d running; one may end within %s\n", res.Limit-res.Remaining, res.Limit, res.RetryAfter.Round(time.Second))
			return
		}
		fmt.Println("lease", res.Lease.Token > 0) // its fencing token: pass it to what the export writes
		// Released when the export is done (here: when the example returns).
		defer exports.Release(ctx, "org-42", res.Lease.ID)
		// While it works, the holder extends it every TTL/3:
		// exports.Extend(ctx, "org-42", res.Lease.ID); one that dies stops
		// extending, and its slot comes back at the TTL.
	}
	// Output:
	// lease true
	// lease true
	// 2 of 2 running; one may end within 30s
}

func Example_alerts() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	quota, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "api-calls", Capacity: 1000, Refill: 1000,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		// Tell at 80% and 100% of the month's 1000, at 100 left, and at a denial.
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.8, 1}, BalanceAtOrBelow: []int64{100}, Exhausted: true},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Every instance runs a consumer (go consumer.Run(ctx)). Its handler runs in
	// the transaction that marks the event delivered: with River,
	// riverClient.InsertTx(ctx, tx, AlertEmailArgs{EventID: e.ID}, nil).
	consumer, err := events.NewConsumer(pool, events.ConsumerConfig{
		Handler: func(ctx context.Context, tx pgx.Tx, e events.Event) error {
			fmt.Println("alert:", e.Key, e.Kind, e.Fraction, e.Level, "balance", e.Balance)
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, calls := range []int64{700, 150, 100, 100} {
		if _, err := quota.AllowN(ctx, "customer-42", calls); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := consumer.RunOnce(ctx); err != nil { // deliver what is due now
		log.Fatal(err)
	}
	// Output:
	// alert: customer-42 used 0.8 0 balance 150
	// alert: customer-42 below 0 100 balance 50
	// alert: customer-42 exhausted 0 0 balance 50
}

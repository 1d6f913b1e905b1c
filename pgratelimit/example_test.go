package pgratelimit_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A request-rate limit: bursts of 10, then 1 request a second per client.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Create the tables (a no-op when they exist).
	db := stdlib.OpenDBFromPool(pool)
	if err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	db.Close()

	limiter, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix:   "api",
		Capacity: 10,
		Refill:   1,
		Interval: time.Second,
		Storage:  pgratelimit.Ephemeral,
	})
	if err != nil {
		log.Fatal(err)
	}

	res, err := limiter.Allow(ctx, "client-203.0.113.7")
	if err != nil {
		log.Fatal(err) // the database failed; being denied is not an error
	}
	if !res.Allowed {
		fmt.Printf("slow down: retry in %s\n", res.RetryAfter)
		return
	}
	fmt.Printf("allowed, %d of %d left\n", res.Remaining, res.Limit)
}

// Charging credits atomically with the work they pay for: the credits are
// spent only if the transaction commits.
func ExampleLimiter_AllowNTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix:   "credits",
		Capacity: 1000,
		Refill:   1000,
		Interval: 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op

	res, err := credits.AllowNTx(ctx, tx, "account-42", 25)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("out of credits until", time.Now().Add(res.RetryAfter).Format(time.RFC3339))
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO reports (account) VALUES ($1)", "account-42"); err != nil {
		log.Fatal(err) // rolled back: the 25 credits are not spent
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

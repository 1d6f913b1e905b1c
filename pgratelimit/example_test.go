package pgratelimit_test

import (
	"context"
	"database/sql"
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

// Two limits on one API key, "10 per second and 1000 per day", charged
// together: a request the daily limit denies spends nothing of the
// per-second one.
func ExampleAllowAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	perSecond, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "api-second", Capacity: 10, Refill: 10, Interval: time.Second, Storage: pgratelimit.Ephemeral,
	})
	if err != nil {
		log.Fatal(err)
	}
	perDay, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "api-day", Capacity: 1000, Refill: 1000, Interval: 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}

	res, err := pgratelimit.AllowAll(ctx,
		pgratelimit.Charge{Limiter: perSecond, Key: "key-123", Cost: 1},
		pgratelimit.Charge{Limiter: perDay, Key: "key-123", Cost: 1},
	)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		if !res.Results[1].Allowed {
			fmt.Println("daily quota used up")
		}
		fmt.Printf("retry in %s\n", res.RetryAfter)
		return
	}
	fmt.Printf("allowed: %d left this second, %d today\n", res.Results[0].Remaining, res.Results[1].Remaining)
}

// Plans: limiters that share a Prefix share buckets, so a customer's plan is
// just which Limiter checks their key. An upgrade keeps the tokens and
// refills up to the new capacity; a downgrade clamps.
func Example_plans() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	plans := map[string]*pgratelimit.Limiter{}
	for plan, perMinute := range map[string]int64{"free": 10, "pro": 600} {
		l, err := pgratelimit.New(pool, pgratelimit.Config{
			Prefix: "api", Capacity: perMinute, Refill: perMinute, Interval: time.Minute,
		})
		if err != nil {
			log.Fatal(err)
		}
		plans[plan] = l
	}

	customerPlan := "pro" // looked up from the API key
	res, err := plans[customerPlan].Allow(ctx, "customer-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Remaining)
}

// Charging credits in a database/sql transaction (sqlc, GORM, bun, lib/pq):
// the same statements, spent only if the transaction commits.
func ExampleLimiter_AllowNSQLTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "credits", Capacity: 1000, Refill: 1000, Interval: 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // or "postgres" with lib/pq
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	res, err := credits.AllowNSQLTx(ctx, tx, "account-42", 25)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		return
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO reports (account) VALUES ($1)", "account-42"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

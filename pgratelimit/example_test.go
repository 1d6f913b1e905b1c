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
	// Output: allowed, 9 of 10 left
}

// openPool is the examples' pool, on a migrated database.
func openPool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		log.Fatal(err)
	}
	return pool
}

// Charging credits atomically with the work they pay for: the credits are
// spent only if the transaction commits.
func ExampleLimiter_In() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "credits-in", Capacity: 1000, Refill: 1000, Interval: 24 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS invoices (account text)"); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // after Commit, a no-op
	res, err := credits.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "account-42", 25)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("out of credits")
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO invoices (account) VALUES ($1)", "account-42"); err != nil {
		log.Fatal(err) // rolled back: the 25 credits are not spent
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	res, err = credits.Peek(ctx, "account-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Remaining)
	// Output: 975
}

// Charging credits in a database/sql transaction (sqlc, GORM, bun, lib/pq):
// the same statements, spent only if the transaction commits.
func ExampleSQLTx() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "credits-sql", Capacity: 1000, Refill: 1000, Interval: 24 * time.Hour,
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
	res, err := credits.In(pgratelimit.SQLTx(tx)).AllowN(ctx, "account-42", 25)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Remaining)
	if err := tx.Rollback(); err != nil { // the app's write failed, say
		log.Fatal(err)
	}
	res, err = credits.Peek(ctx, "account-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Remaining)
	// Output:
	// true 975
	// 1000
}

// Two limits on one API key, "10 per second and 1000 per day", charged
// together: a request the daily limit denies spends nothing of the
// per-second one.
func ExampleAllowAll() {
	ctx := context.Background()
	pool := openPool(ctx)
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
		perSecond.Charge("key-123", 1),
		perDay.Charge("key-123", 1),
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
	// Output: allowed: 9 left this second, 999 today
}

// Plans: limiters that share a Prefix share buckets, so a customer's plan is
// just which Limiter checks their key. An upgrade adds the difference of the
// capacities at once; a downgrade clamps.
func Example_plans() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	plans := map[string]*pgratelimit.Limiter{}
	for plan, perMonth := range map[string]int64{"free": 1000, "pro": 5000} {
		l, err := pgratelimit.New(pool, pgratelimit.Config{
			Prefix: "api-plan", Capacity: perMonth, Refill: perMonth,
			Calendar: pgratelimit.Calendar{Every: pgratelimit.Month},
		})
		if err != nil {
			log.Fatal(err)
		}
		plans[plan] = l
	}

	res, err := plans["free"].AllowN(ctx, "customer-42", 600)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("free:", res.Remaining, "of", res.Limit)
	res, err = plans["pro"].Allow(ctx, "customer-42") // upgraded: 4000 more
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pro:", res.Remaining, "of", res.Limit)
	// Output:
	// free: 400 of 1000
	// pro: 4399 of 5000
}

// Time made explicit in a test: a clock of the test's own replaces the
// database's, so refills happen when the test says.
func ExampleConfig_clock() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "t", Capacity: 3, Refill: 1, Interval: 10 * time.Second,
		Clock: func() time.Time { return now },
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := l.AllowN(ctx, "k", 3)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Remaining, res.ResetAfter)
	now = now.Add(10 * time.Second) // one refill
	res, err = l.Peek(ctx, "k")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Remaining, res.ResetAfter)
	// Output:
	// 0 30s
	// 1 20s
}

package pgratelimit_test

// The README's code, compiled: each fragment below appears in README.md or
// docs/*.md as it is here (internal/readme's test checks that they match).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// readmeSetup is what the README's fragments take as given.
func readmeSetup() (context.Context, *pgxpool.Pool, *sql.DB) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	return ctx, pool, stdlib.OpenDBFromPool(pool)
}

func runCompletion() int64 { return 620 }

var errOutOfCredits = errors.New("out of credits")

// README, Quotas and credits: a calendar month in Berlin.
func Example_readmeCalendar() {
	ctx, pool, _ := readmeSetup()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		log.Fatal(err)
	}
	monthly, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "calls", Capacity: 1000, Refill: 1000, // Refill == Capacity: the quota resets
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month, Location: berlin}, // the 1st, 00:00 Berlin
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := monthly.Allow(ctx, "customer-42")
	if err != nil {
		log.Fatal(err)
	}
	// A customer whose cycle starts on the day they subscribed:
	subscribedAt := time.Date(2026, 1, 31, 9, 30, 0, 0, berlin)
	res, err = monthly.WithAnchor(subscribedAt).Allow(ctx, "customer-43")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.RetryAfter)
}

// README, Quotas and credits: grants on top of a plan, a request ID, settling.
func Example_readmeCredits() {
	ctx, pool, _ := readmeSetup()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "credits", Capacity: 500, Refill: 500, Interval: 30 * 24 * time.Hour,
		Grants: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	// A pack of 1000 that never expires, and a promotion of 200 until the new year.
	if _, err := credits.Grant(ctx, "customer-42", 1000, time.Time{}); err != nil {
		log.Fatal(err)
	}
	if _, err := credits.Grant(ctx, "customer-42", 200, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		log.Fatal(err)
	}
	res, err := credits.AllowN(ctx, "customer-42", 40)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("allowed=%v in the plan: %d, granted: %d\n", res.Allowed, res.Remaining, res.Granted)
	{
		ctx := pgratelimit.WithRequestID(ctx, "order-8812") // the caller's idempotency key
		res, err := credits.AllowN(ctx, "customer-42", 40)
		if err != nil {
			// Retry with the same ctx: if the first attempt committed, the retry
			// returns its outcome and charges nothing.
			res, err = credits.AllowN(ctx, "customer-42", 40)
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v remaining=%d\n", res.Allowed, res.Remaining)
	}
	settle := func() error {
		ctx := pgratelimit.WithRequestID(ctx, "completion-77")
		est, err := credits.AllowN(ctx, "customer-42", 500) // the estimate
		if err != nil || !est.Allowed {
			return err
		}
		used := runCompletion() // the actual cost: 620 tokens
		res, err := credits.Settle(ctx, "customer-42", "completion-77", used)
		if err != nil {
			return err
		}
		fmt.Printf("balance %d\n", res.Remaining) // negative while the key owes
		return nil
	}
	if err := settle(); err != nil {
		log.Fatal(err)
	}
}

// README, plans (AllowAll's block is ExampleAllowAll's).
func Example_readmePlans() {
	ctx, pool, _ := readmeSetup()
	plans := map[string]*pgratelimit.Limiter{}
	for plan, perMinute := range map[string]int64{"free": 10, "pro": 600} {
		l, err := pgratelimit.New(pool, pgratelimit.Config{
			Prefix: "api-plan", Capacity: perMinute, Refill: perMinute, Interval: time.Minute,
		})
		if err != nil {
			log.Fatal(err)
		}
		plans[plan] = l
	}
	res, err := plans["pro"].Allow(ctx, "customer-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed)
}

// README, Transactions.
func Example_readmeTransactions() {
	ctx, pool, _ := readmeSetup()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "credits", Capacity: 500, Refill: 500, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	accountID, cost := "account-1", int64(5)
	charge := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		res, err := credits.AllowNTx(ctx, tx, accountID, cost)
		if err != nil {
			return err
		}
		if !res.Allowed {
			return errOutOfCredits
		}
		if _, err := tx.Exec(ctx, "INSERT INTO reports (account_id) VALUES ($1)", accountID); err != nil {
			return err // rolled back: nothing charged
		}
		return tx.Commit(ctx)
	}
	if err := charge(); err != nil {
		log.Fatal(err)
	}
}

// README, Operations: migrations, the cleaner, a Client.
func Example_readmeOperations() {
	ctx, pool, db := readmeSetup()
	err := migrations.Up(ctx, db)         // apply; a no-op when up to date
	err = migrations.Down(ctx, db)        // roll back the latest
	st, err := migrations.Status(ctx, db) // []*goose.MigrationStatus
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(st))
	{
		cleaner, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{
			Interval: time.Minute, // the default
			Logger:   slog.Default(),
		})
		if err != nil {
			log.Fatal(err)
		}
		go cleaner.Run(ctx) // returns nil when ctx is cancelled
	}
	{
		client, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{CoalesceConns: 2})
		if err != nil {
			log.Fatal(err) // it asked the database whether it is plain PostgreSQL or Citus
		}
		defer client.Close(context.Background()) // waits for the checks in flight
		api, err := client.NewLimiter(pgratelimit.Config{Prefix: "api", Capacity: 10, Refill: 1, Interval: time.Second})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(api != nil)
	}
}

// docs/testing.md: a clock of the test's own.
func Example_readmeClock() {
	_, pool, _ := readmeSetup()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, _ := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "t", Capacity: 3, Refill: 1, Interval: 10 * time.Second,
		Clock: func() time.Time { return now },
	})
	now = now.Add(10 * time.Second)
	fmt.Println(l != nil)
}

package main

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

func main() {
	// Bound every wait: DATABASE_URL=postgres://app@db/app?connect_timeout=5
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		log.Fatal(err)
	}
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{ // bursts of 10, then 1 a second, per key
		Prefix: "api", Capacity: 10, Refill: 1, Interval: time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := limiter.Allow(ctx, "client-203.0.113.7")
	if err != nil {
		log.Fatal(err) // the database failed; being denied is not an error
	}
	fmt.Printf("allowed=%v remaining=%d/%d\n", res.Allowed, res.Remaining, res.Limit)
}

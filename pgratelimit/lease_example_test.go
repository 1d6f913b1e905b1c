package pgratelimit_test

// The README's "Concurrency leases" code, compiled (internal/readme's test
// checks that the README's fragment is here, line for line).

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

func runExport(context.Context) {}

// At most 2 exports at once per organization: a lease of one of 2 slots,
// held while the export runs, extended as a heartbeat, released at the end;
// a crashed holder's slot comes back at the TTL by itself.
func ExampleSemaphore() {
	ctx, pool, _ := readmeSetup()
	export(ctx, pool)
}

func export(ctx context.Context, pool *pgxpool.Pool) {
	exports, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{
		Prefix: "exports", Max: 2, TTL: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := exports.Acquire(ctx, "org-42", 1)
	if err != nil {
		log.Fatal(err) // the database failed; no free slot is not an error
	}
	if !res.Acquired {
		fmt.Printf("%d of %d exports running; retry in %s\n", res.Held, res.Limit, res.RetryAfter)
		return
	}
	defer exports.Release(ctx, "org-42", res.Lease.ID)
	go func() { // heartbeat: the lease counts for 30s after each Extend
		for range time.Tick(10 * time.Second) {
			if _, err := exports.Extend(ctx, "org-42", res.Lease.ID); err != nil {
				return // ErrLeaseExpired: the slot may be someone else's now
			}
		}
	}()
	runExport(ctx)
}

// A lease together with a rate limit, all or nothing: one of 5 slots and
// one request of the per-minute rate, or neither.
func ExampleAllowAll_lease() {
	ctx, pool, _ := readmeSetup()
	perMinute, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "completions", Capacity: 60, Refill: 60, Interval: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	inFlight, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "in-flight", Max: 5, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	m, err := pgratelimit.AllowAll(ctx,
		pgratelimit.Charge{Semaphore: inFlight, Key: "customer-7", Cost: 1},
		pgratelimit.Charge{Limiter: perMinute, Key: "customer-7", Cost: 1},
	)
	if err != nil {
		log.Fatal(err)
	}
	if !m.Allowed {
		fmt.Printf("retry in %s\n", m.RetryAfter)
		return
	}
	defer inFlight.Release(ctx, "customer-7", m.Leases[0].ID)
}

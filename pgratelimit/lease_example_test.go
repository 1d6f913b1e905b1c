package pgratelimit_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A lease together with a rate limit, all or nothing: one of 5 slots and
// one request of the per-minute rate, or neither.
func ExampleAllowAll_lease() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	perMinute, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "completions", Capacity: 60, Refill: 60, Interval: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	inFlight, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "in-flight", Max: 5, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	m, err := pgratelimit.AllowAll(ctx,
		inFlight.Charge("customer-7", 1),
		perMinute.Charge("customer-7", 1),
	)
	if err != nil {
		log.Fatal(err)
	}
	if !m.Allowed {
		fmt.Printf("retry in %s\n", m.RetryAfter)
		return
	}
	defer inFlight.Release(ctx, "customer-7", m.Leases[0].ID)
	fmt.Printf("%d slots free, %d requests left this minute\n", m.Results[0].Remaining, m.Results[1].Remaining)
	// Output: 4 slots free, 59 requests left this minute
}

// A holder's life: acquire, extend as a heartbeat while the work runs,
// release when done. A holder that dies stops extending, and its units come
// back at the TTL.
func ExampleSemaphore_Extend() {
	ctx := context.Background()
	pool := openPool(ctx)
	defer pool.Close()
	jobs, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "jobs", Max: 1, TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	res, err := jobs.Acquire(ctx, "resource-9", 1)
	if err != nil || !res.Allowed {
		log.Fatal("not acquired: ", err)
	}
	work, done := context.WithCancel(ctx)
	go func() { // the heartbeat
		t := time.NewTicker(10 * time.Second) // TTL/3
		defer t.Stop()
		for {
			select {
			case <-work.Done():
				return
			case <-t.C:
				if _, err := jobs.Extend(ctx, "resource-9", res.Lease.ID); err != nil {
					done() // ErrLeaseExpired: the slot may be another's now; stop working
					return
				}
			}
		}
	}()
	// ... the job runs under work ...
	done()
	if err := jobs.Release(ctx, "resource-9", res.Lease.ID); err != nil {
		log.Fatal(err)
	}
	leases, err := jobs.Leases(ctx, "resource-9")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(leases), "leases held")
	// Output: 0 leases held
}

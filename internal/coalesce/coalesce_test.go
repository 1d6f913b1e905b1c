package coalesce

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// A caller whose context ends while queued returns at once, spending
// nothing, and leaves the queue.
func TestQueuedCallerLeaves(t *testing.T) {
	ctx := context.Background()
	co := New(unreachable(t), 2)
	co.mu.Lock()
	co.busy = co.slots // hold every slot so checks queue
	co.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	q := &engine.Request{Ctx: cctx, Kind: account.OpCharge, Charges: []engine.Charge{{
		Row: engine.Row{Prefix: "c", Key: "k"}, Cost: 5,
		Policy: account.Policy{Capacity: 100, Refill: 1, Schedule: account.Grid(time.Hour)}}}}
	ret := make(chan error)
	go func() { ret <- co.Do(q, engine.Settings{Dialect: engine.Postgres{}}, nil) }()
	for {
		co.mu.Lock()
		n := len(co.queue)
		co.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-ret; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued check returned %v", err)
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.queue) != 0 || q.Decided() {
		t.Fatal("cancelled check left in the queue, or decided")
	}
	co.busy = 0
}

// While a slot is busy, checks queue until openAt of them make a batch worth
// a transaction of its own on the free slot (see openAt); an idle
// coalescer runs a check at once.
func TestFreeSlotOpensForABatch(t *testing.T) {
	ctx := context.Background()
	co := New(unreachable(t), 2)
	co.mu.Lock()
	co.busy = 1 // one slot busy, one free
	co.mu.Unlock()
	queued := func() int {
		co.mu.Lock()
		defer co.mu.Unlock()
		return len(co.queue)
	}
	check := func(i int) chan error {
		q := &engine.Request{Ctx: ctx, Kind: account.OpCharge, Charges: []engine.Charge{{
			Row: engine.Row{Prefix: "c", Key: fmt.Sprint(i)}, Cost: 1,
			Policy: account.Policy{Capacity: 100, Refill: 1, Schedule: account.Grid(time.Hour)}}}}
		ret := make(chan error, 1)
		go func() { ret <- co.Do(q, engine.Settings{Dialect: engine.Postgres{}}, nil) }()
		return ret
	}
	var rets []chan error
	for i := range openAt - 1 {
		rets = append(rets, check(i))
		for deadline := time.Now().Add(10 * time.Second); queued() != i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("check %d did not queue behind a busy slot (%d queued)", i, queued())
			}
		}
	}
	time.Sleep(20 * time.Millisecond)
	if n := queued(); n != openAt-1 {
		t.Fatalf("%d checks queued behind a busy slot, want %d: a batch started below openAt", n, openAt-1)
	}
	rets = append(rets, check(openAt)) // a batch's worth: it starts, and fails to connect
	for _, ret := range rets {
		if err := <-ret; err == nil {
			t.Fatal("a check through an unreachable database succeeded")
		}
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d checks left queued", n)
	}

	co.mu.Lock()
	co.busy = 0 // idle: a check starts at once, alone
	co.mu.Unlock()
	if err := <-check(-1); err == nil {
		t.Fatal("a check through an unreachable database succeeded")
	}
	co.Wait()
}

// A goroutine that ran a batch waits for the next one rather than ending, so
// that batches do not grow a new goroutine's stack each time; Wait ends it.
func TestBatchGoroutineWaitsForTheNext(t *testing.T) {
	ctx := context.Background()
	co := New(unreachable(t), 2)
	co.mu.Lock()
	co.busy = 1 // one slot busy: openAt queued checks start a batch on the other
	co.mu.Unlock()
	idle := func() int {
		co.mu.Lock()
		defer co.mu.Unlock()
		return len(co.idle)
	}
	batch := func(round int) {
		rets := make([]chan error, openAt)
		for i := range rets {
			q := &engine.Request{Ctx: ctx, Kind: account.OpCharge, Charges: []engine.Charge{{
				Row: engine.Row{Prefix: "c", Key: fmt.Sprint(round, "-", i)}, Cost: 1,
				Policy: account.Policy{Capacity: 100, Refill: 1, Schedule: account.Grid(time.Hour)}}}}
			rets[i] = make(chan error, 1)
			go func() { rets[i] <- co.Do(q, engine.Settings{Dialect: engine.Postgres{}}, nil) }()
		}
		for _, ret := range rets {
			if err := <-ret; err == nil {
				t.Fatal("a check through an unreachable database succeeded")
			}
		}
		for deadline := time.Now().Add(10 * time.Second); idle() != 1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d goroutines wait for a batch, want 1", round, idle())
			}
		}
	}
	batch(1)
	batch(2) // taken by the waiting goroutine: a new one would make 2 wait
	co.Wait()
	if n := idle(); n != 0 {
		t.Fatalf("%d goroutines wait for a batch after Wait", n)
	}
	co.mu.Lock()
	co.busy = 0
	co.mu.Unlock()
}

// unreachable is a pool of a database nobody listens for: a batch that
// starts on it fails at once.
func unreachable(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

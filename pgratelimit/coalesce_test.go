package pgratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A batch gives every check exactly the result it gets one by one, in the
// batch's order: same clock, same costs, same keys, two databases.
func TestBatchEqualsOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cfg := Config{Prefix: "b", Capacity: 9, Refill: 2, Interval: time.Second, Clock: clock, DisableCoalescing: true}
	batched, err := New(testdb.Pool(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	single, err := New(testdb.Pool(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 40 {
		now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		batch := make([]*pending, 2+rng.IntN(30))
		for i := range batch {
			batch[i] = &pending{ctx: ctx, key: fmt.Sprintf("k%d", rng.IntN(5)), cost: 1 + rng.Int64N(9), done: make(chan struct{})}
		}
		batched.runBatch(batch)
		for i, p := range batch {
			want, err := single.allowOne(ctx, p.key, p.cost)
			if err != nil || p.err != nil {
				t.Fatalf("round %d check %d: errors %v / %v", round, i, err, p.err)
			}
			if p.res != want {
				t.Fatalf("round %d check %d (%s cost %d): batch %+v, one by one %+v", round, i, p.key, p.cost, p.res, want)
			}
		}
	}
	// And the stored state agrees.
	for k := range 5 {
		key := fmt.Sprintf("k%d", k)
		a, _ := batched.Peek(ctx, key)
		b, _ := single.Peek(ctx, key)
		if a != b {
			t.Fatalf("%s: batched %+v, one by one %+v", key, a, b)
		}
	}
}

// A caller whose context ends while queued returns at once, spending
// nothing; a member cancelled before its batch decides spends nothing.
func TestCoalescerCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := New(pool, Config{Prefix: "c", Capacity: 100, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Hold every slot so checks queue.
	co := l.co
	co.mu.Lock()
	co.busy = co.maxSlots
	co.mu.Unlock()

	cctx, cancel := context.WithCancel(ctx)
	ret := make(chan error)
	go func() {
		_, err := l.AllowN(cctx, "k", 5)
		ret <- err
	}()
	waitQueued(co, 1)
	cancel()
	if err := <-ret; err != context.Canceled {
		t.Fatalf("queued check returned %v", err)
	}
	co.mu.Lock()
	if len(co.queue) != 0 {
		t.Fatal("cancelled check left in the queue")
	}
	co.busy = 0
	co.mu.Unlock()

	// Handed a slot just as its context ends: the batch still starts for
	// the others, and the slot comes back.
	co.mu.Lock()
	co.busy = co.maxSlots
	co.mu.Unlock()
	lctx, lcancel := context.WithCancel(ctx)
	other := make(chan Result)
	go func() {
		r, err := l.AllowN(ctx, "other", 1)
		if err != nil {
			t.Errorf("other: %v", err)
		}
		other <- r
	}()
	go func() {
		_, err := l.AllowN(lctx, "k", 1)
		ret <- err
	}()
	waitQueued(co, 2)
	lcancel()
	<-ret
	co.release() // the slot goes to the first queued check
	if r := <-other; !r.Allowed {
		t.Fatalf("other check: %+v", r)
	}
	for {
		co.mu.Lock()
		busy := co.busy
		co.mu.Unlock()
		if busy == co.maxSlots-1 {
			break // every slot but the one we hold came back
		}
		time.Sleep(time.Millisecond)
	}
	co.mu.Lock()
	co.busy = 0
	co.mu.Unlock()

	// In a batch: the cancelled member gets ctx's error and takes nothing.
	dead, cancelDead := context.WithCancel(ctx)
	cancelDead()
	batch := []*pending{
		{ctx: ctx, key: "k", cost: 1, done: make(chan struct{})},
		{ctx: dead, key: "k", cost: 50, done: make(chan struct{})},
		{ctx: ctx, key: "k", cost: 2, done: make(chan struct{})},
	}
	l.runBatch(batch)
	if batch[1].err != context.Canceled || batch[0].err != nil || batch[2].err != nil {
		t.Fatalf("errors: %v %v %v", batch[0].err, batch[1].err, batch[2].err)
	}
	if batch[2].res.Remaining != 97 {
		t.Fatalf("remaining %d, want 97", batch[2].res.Remaining)
	}
	r, err := l.Peek(ctx, "k")
	if err != nil || r.Remaining != 97 {
		t.Fatalf("peek %+v %v", r, err)
	}
}

// waitQueued waits until n checks are queued.
func waitQueued(co *coalescer, n int) {
	for {
		co.mu.Lock()
		queued := len(co.queue)
		co.mu.Unlock()
		if queued == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

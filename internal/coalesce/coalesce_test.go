package coalesce

import (
	"context"
	"errors"
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
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none") // never connected to
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	co := New(pool, 2)
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

package events

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Redeliver makes a delivered event undelivered and due, and a Consumer
// delivers it again; an unknown ID is ErrNotFound.
func TestRedeliver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "p", Capacity: 1, Refill: 1, Interval: time.Hour,
		Alerts: pgratelimit.Alerts{Exhausted: true}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	var seen []Event
	c, err := NewConsumer(pool, ConsumerConfig{Handler: func(_ context.Context, _ pgx.Tx, e Event) error {
		seen = append(seen, e)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(want int) {
		t.Helper()
		if n, err := c.RunOnce(ctx); n != want || err != nil {
			t.Fatalf("RunOnce: %d, %v; want %d", n, err, want)
		}
	}
	deliver(1)
	deliver(0)
	first := seen[0]
	evs, err := List(ctx, pool, Filter{Key: "k"})
	if err != nil || len(evs) != 1 || evs[0].ID != first.ID || evs[0].DeliveredAt.IsZero() || evs[0].Attempts != 1 {
		t.Fatalf("delivered: %+v, %v", evs, err)
	}
	if err := Redeliver(ctx, pool, first.ID); err != nil {
		t.Fatal(err)
	}
	evs, err = List(ctx, pool, Filter{Key: "k"})
	if err != nil || len(evs) != 1 || !evs[0].DeliveredAt.IsZero() || evs[0].Attempts != 0 {
		t.Fatalf("redelivered: %+v, %v", evs, err)
	}
	deliver(1)
	if seen[1].ID != first.ID {
		t.Errorf("delivered again: %+v", seen[1])
	}
	if err := Redeliver(ctx, pool, first.ID+1); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown ID: %v, want ErrNotFound", err)
	}
	if err := Redeliver(ctx, nil, 1); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
}

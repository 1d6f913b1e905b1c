package events

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/alert"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

func TestConsumerConfig(t *testing.T) {
	h := func(context.Context, pgx.Tx, Event) error { return nil }
	pool := lazyPool(t)
	for _, c := range []struct {
		cfg   ConsumerConfig
		field string
	}{
		{ConsumerConfig{}, "Handler"},
		{ConsumerConfig{Handler: h, BatchSize: -1}, "BatchSize"},
		{ConsumerConfig{Handler: h, BatchSize: 10001}, "BatchSize"},
		{ConsumerConfig{Handler: h, PollInterval: -1}, "PollInterval"},
		{ConsumerConfig{Handler: h, HandlerTimeout: -1}, "HandlerTimeout"},
		{ConsumerConfig{Handler: h, MaxAttempts: -1}, "MaxAttempts"},
		{ConsumerConfig{Handler: h, Prefixes: []string{""}}, "Prefixes"},
		{ConsumerConfig{Handler: h, Prefixes: []string{"a\x00"}}, "Prefixes"},
	} {
		_, err := NewConsumer(pool, c.cfg)
		if !errors.Is(err, pgratelimit.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want pgratelimit.ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
	}
	if _, err := NewConsumer(nil, ConsumerConfig{Handler: h}); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
	if _, err := List(context.Background(), nil, Filter{}); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
	for _, f := range []Filter{{Limit: -1}, {Limit: 10001}, {Prefix: "a\x00"}, {Key: "\xff"}} {
		if _, err := List(context.Background(), pool, f); !errors.Is(err, pgratelimit.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", f, err)
		}
	}
}

// lazyPool is a pool that never connects unless asked to (and then fails).
func lazyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// eventOf reads an event's line from its threshold's text, by its kind.
func TestEventOf(t *testing.T) {
	for _, c := range []struct {
		row   alert.EventRow
		frac  float64
		level int64
	}{
		{alert.EventRow{Kind: "used", Threshold: "0.8"}, 0.8, 0},
		{alert.EventRow{Kind: "below", Threshold: "-100"}, 0, -100},
		{alert.EventRow{Kind: "exhausted"}, 0, 0},
	} {
		e := eventOf(c.row)
		if string(e.Kind) != c.row.Kind || e.Fraction != c.frac || e.Level != c.level {
			t.Errorf("%+v: %+v", c.row, e)
		}
	}
}

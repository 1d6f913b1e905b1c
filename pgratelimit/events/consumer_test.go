package events

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

func TestDefaultBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second,
		12: 2048 * time.Second, 13: time.Hour, 1000: time.Hour, math.MaxInt: time.Hour, math.MinInt: time.Second} {
		if got := defaultBackoff(n); got != want {
			t.Errorf("defaultBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestErrorText(t *testing.T) {
	long := strings.Repeat("é", 1500) // 3000 bytes
	for _, s := range []string{"plain", "nul \x00 byte", "bad \xff utf-8", long} {
		got := errorText(errors.New(s))
		if !utf8.ValidString(got) || strings.Contains(got, "\x00") || len(got) > 2000 {
			t.Errorf("%q: %q", s[:min(len(s), 20)], got[:min(len(got), 20)])
		}
	}
}

// A handler's panic is its error, and the consumer goes on.
func TestHandlerPanic(t *testing.T) {
	c, err := NewConsumer(lazyPool(t), ConsumerConfig{Handler: func(context.Context, pgx.Tx, Event) error { panic("boom") }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.call(context.Background(), nil, Event{}); !errors.Is(err, errHandlerPanic) || !strings.Contains(err.Error(), "boom") {
		t.Errorf("%v", err)
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

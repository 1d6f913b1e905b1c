package pgratelimit

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func TestAlertsConfig(t *testing.T) {
	base := Config{Prefix: "a", Capacity: 10, Refill: 1, Interval: time.Second}
	ok := []Alerts{
		{},
		{UsedFractions: []float64{0.8, 0.9, 1}, BalanceAtOrBelow: []int64{100, 0}, Exhausted: true},
		{Exhausted: true},
	}
	for _, a := range ok {
		c := base
		c.Alerts = a
		if err := c.validate(); err != nil {
			t.Errorf("%+v: %v", a, err)
		}
	}
	many := make([]int64, 64)
	for i := range many {
		many[i] = int64(i)
	}
	for _, c := range []struct {
		a     Alerts
		field string
	}{
		{Alerts{UsedFractions: []float64{0}}, "Alerts.UsedFractions"},
		{Alerts{UsedFractions: []float64{1.5}}, "Alerts.UsedFractions"},
		{Alerts{UsedFractions: []float64{math.NaN()}}, "Alerts.UsedFractions"},
		{Alerts{UsedFractions: []float64{0.5, 0.5}}, "Alerts.UsedFractions"},
		{Alerts{BalanceAtOrBelow: []int64{-1}}, "Alerts.BalanceAtOrBelow"},
		{Alerts{BalanceAtOrBelow: many}, "at most 63"},
	} {
		cfg := base
		cfg.Alerts = c.a
		err := cfg.validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want ErrInvalidConfig naming %s", c.a, err, c.field)
		}
	}
	eph := base
	eph.Storage, eph.Alerts = Ephemeral, Alerts{Exhausted: true}
	if err := eph.validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Storage Durable") {
		t.Errorf("ephemeral: %v", err)
	}
	l, err := New(lazyPool(t), base)
	if err != nil || l.alerts != nil || l.charge("k", 1).Observer != nil {
		t.Errorf("a limiter without alerts has an observer: %v", err)
	}
	base.Alerts = Alerts{Exhausted: true}
	if l, err = New(lazyPool(t), base); err != nil || l.charge("k", 1).Observer == nil || l.WithAnchor(t0).charge("k", 1).Observer == nil {
		t.Errorf("a limiter with alerts has no observer: %v", err)
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

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

var berlin = func() *time.Location {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	return loc
}()

func TestCalendarValidate(t *testing.T) {
	for _, p := range []Period{Day, Week, Month} {
		if err := (Calendar{Every: p}).validate(); err != nil {
			t.Errorf("%v: %v", p, err)
		}
	}
	for _, p := range []Period{0, -1, 4} {
		err := Calendar{Every: p, Location: berlin}.validate()
		if err == nil || !strings.Contains(err.Error(), "Calendar.Every") {
			t.Errorf("Every %d: %v", p, err)
		}
	}
	if got := fmt.Sprint(Day, Week, Month, Period(7)); got != "day week month Period(7)" {
		t.Errorf("String: %s", got)
	}
}

// FuzzValidate feeds arbitrary keys, prefixes, costs and policies to the
// validation and the math: never a panic, and what passes really is valid.
func FuzzValidate(f *testing.F) {
	f.Add("user-1", "api", int64(1), int64(10), int64(1), int64(1e9))
	f.Add("", "\x00", int64(0), int64(-1), int64(0), int64(0))
	f.Add("\xff", "p", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, key, prefix string, cost, capacity, refill, interval int64) {
		if err := validateKey(key); err == nil {
			if key == "" || len(key) > maxKeyLen || strings.ContainsRune(key, 0) || !utf8.ValidString(key) {
				t.Fatalf("invalid key %q passed", key)
			}
		} else if !errors.Is(err, ErrInvalidKey) || !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("untyped error %v", err)
		}
		cfg := Config{Prefix: prefix, Capacity: capacity, Refill: refill, Interval: time.Duration(interval)}
		if err := cfg.validate(); err != nil {
			var ce *ConfigError
			if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "Config.") {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		l := &Limiter{cfg: cfg, p: cfg.policy()}
		err := l.validateCost(cost)
		if err != nil {
			if !errors.Is(err, ErrInvalidCost) && !errors.Is(err, ErrCostExceedsCapacity) || !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		s, c, err := account.Apply(l.p, account.State{}, t0, account.Op{Kind: account.OpCharge, Amount: cost})
		if err != nil || !c.Allowed || s.Bucket.Tokens != capacity-cost || c.RetryAfter != 0 || c.ResetAfter < 0 {
			t.Fatalf("fresh bucket, cost %d: %+v %+v %v", cost, s, c, err)
		}
		later, _ := l.p.Load(s.Bucket, t0.Add(time.Duration(interval)))
		if later.Tokens < s.Bucket.Tokens || later.Tokens > capacity {
			t.Fatalf("refill out of range: %+v", later)
		}
	})
}

// A configuration error names its field in a *ConfigError that matches
// ErrInvalidConfig and nothing else; a bad argument matches
// ErrInvalidArgument and its own sentinel, and is never ErrInvalidConfig.
func TestErrorFamilies(t *testing.T) {
	cases := []struct {
		err   error
		field string
	}{
		{Config{Prefix: "p", Capacity: 0, Refill: 1, Interval: time.Second}.validate(), "Config.Capacity"},
		{Config{Prefix: "p", Capacity: 1, Refill: 1}.validate(), "Config.Interval"},
		{Config{Prefix: "p", Capacity: 1, Refill: 1, Calendar: Calendar{Every: 9}}.validate(), "Config.Calendar.Every"},
		{Config{Prefix: "p", Capacity: 1, Refill: 1, Interval: time.Second, Alerts: Alerts{UsedFractions: []float64{2}}}.validate(), "Config.Alerts.UsedFractions"},
		{SemaphoreConfig{Prefix: "p", Max: 1}.validate(), "SemaphoreConfig.TTL"},
	}
	for _, c := range cases {
		var ce *ConfigError
		if !errors.As(c.err, &ce) || !errors.Is(c.err, ErrInvalidConfig) || errors.Is(c.err, ErrInvalidArgument) {
			t.Fatalf("%v: want a *ConfigError matching ErrInvalidConfig only", c.err)
		}
		if !strings.HasPrefix(ce.Field, c.field) || !strings.Contains(c.err.Error(), ce.Field) || ce.Reason == "" {
			t.Errorf("%v: Field %q, Reason %q, want field %s", c.err, ce.Field, ce.Reason, c.field)
		}
	}
	for _, kind := range []error{ErrInvalidKey, ErrInvalidCost, ErrCostExceedsCapacity, ErrInvalidRequestID, ErrInvalidRequestID, ErrInvalidArgument} {
		err := badArg(kind, "detail %d", 7)
		if !errors.Is(err, kind) || !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%v: want %v and ErrInvalidArgument only", err, kind)
		}
		if want := kind.Error() + ": detail 7"; err.Error() != want {
			t.Errorf("message %q, want %q", err.Error(), want)
		}
	}
	if _, err := (Tx{}).AllowAll(context.Background()); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("zero Tx: %v", err)
	}
}

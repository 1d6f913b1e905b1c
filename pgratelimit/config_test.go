package pgratelimit

import (
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
			if key == "" || len(key) > MaxKeyLen || strings.ContainsRune(key, 0) || !utf8.ValidString(key) {
				t.Fatalf("invalid key %q passed", key)
			}
		} else if !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("untyped error %v", err)
		}
		cfg := Config{Prefix: prefix, Capacity: capacity, Refill: refill, Interval: time.Duration(interval)}
		if err := cfg.validate(); err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		l := &Limiter{cfg: cfg, p: cfg.policy()}
		err := l.validateCost(cost)
		if err != nil {
			if !errors.Is(err, ErrInvalidCost) && !errors.Is(err, ErrCostExceedsCapacity) {
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

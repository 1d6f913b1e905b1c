package pgratelimit

import (
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

func TestWindow(t *testing.T) {
	cfg := Config{Capacity: 10, Refill: 3, Interval: 1500 * time.Millisecond}
	if w := window(cfg, Result{}, time.Now()); w != 6*time.Second { // 4 refills of 1.5s
		t.Fatalf("window %s", w)
	}
	cfg = Config{Capacity: 1 << 62, Refill: 1, Interval: 100 * 365 * 24 * time.Hour}
	if w := window(cfg, Result{}, time.Now()); w <= 0 {
		t.Fatalf("huge window overflowed: %s", w)
	}
	// A calendar's window: the time left until an empty bucket is full, the
	// rest of the month for a quota that resets, two boundaries for one
	// that needs two refills.
	now := time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC)
	cfg = Config{Capacity: 1000, Refill: 1000, Calendar: Calendar{Every: Month}}
	if w, want := window(cfg, Result{}, now), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Sub(now); w != want {
		t.Fatalf("monthly window %s, want %s (to March 1st)", w, want)
	}
	cfg.Capacity = 1500
	if w, want := window(cfg, Result{}, now), time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(now); w != want {
		t.Fatalf("rollover window %s, want %s (to April 1st)", w, want)
	}
}

// The window is counted from the check's clock, not the application's: a
// calendar quota's window and ResetAfter agree whatever the skew between
// the two (issue #31).
func TestWindowByTheChecksClock(t *testing.T) {
	cfg := Config{Prefix: "q", Capacity: 1000, Refill: 1000, Calendar: Calendar{Every: Month}}
	p := account.Policy{Capacity: 1000, Refill: 1000, Schedule: account.Calendar(account.Month, nil, time.Time{})}
	checked := time.Date(2026, 1, 10, 12, 0, 0, 300_000_000, time.UTC)
	_, c, err := account.Apply(p, account.State{}, checked, account.Op{Kind: account.OpCharge, Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := Result{Allowed: true, Limit: c.Limit, Remaining: c.Remaining, ResetAfter: c.ResetAfter}
	for _, skew := range []time.Duration{0, 7 * time.Minute, -3 * time.Hour, 11 * time.Hour} {
		if w := window(cfg, r, checked.Add(skew)); w != r.ResetAfter {
			t.Errorf("skew %v: window %s, ResetAfter %s", skew, w, r.ResetAfter)
		}
	}
	// With Refill below Capacity: the boundary that fills an empty bucket.
	cfg.Refill, p.Refill = 400, 400
	_, c, _ = account.Apply(p, account.State{}, checked, account.Op{Kind: account.OpCharge, Amount: 500})
	r = Result{Allowed: true, Limit: c.Limit, Remaining: c.Remaining, ResetAfter: c.ResetAfter}
	want := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(checked) // three refills
	if w := window(cfg, r, checked.Add(5*time.Minute)); w != want {
		t.Errorf("rollover: window %s, want %s", w, want)
	}
}

package pgratelimit

import (
	"testing"
	"time"
)

// The jitter of a retry stays within a quarter of the time left before the
// deadline or MaxWait, so a retry whose tokens arrive in time is made in
// time.
func TestMaxJitter(t *testing.T) {
	for _, c := range []struct {
		wait  time.Duration
		slack []time.Duration
		want  time.Duration
	}{
		{400 * time.Millisecond, nil, 40 * time.Millisecond},
		{time.Second, nil, 50 * time.Millisecond},
		{time.Second, []time.Duration{40 * time.Millisecond}, 10 * time.Millisecond},
		{400 * time.Millisecond, []time.Duration{25 * time.Millisecond, time.Second}, 6250 * time.Microsecond},
		{time.Second, []time.Duration{time.Second, 8 * time.Millisecond}, 2 * time.Millisecond},
		{time.Second, []time.Duration{-time.Millisecond}, 0},
	} {
		if got := maxJitter(c.wait, c.slack...); got != c.want {
			t.Errorf("maxJitter(%s, %v) = %s, want %s", c.wait, c.slack, got, c.want)
		}
	}
}

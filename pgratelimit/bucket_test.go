package pgratelimit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestLoadRefillsOnTheGrid(t *testing.T) {
	p := policy{capacity: 20, refill: 5, interval: 10 * time.Second}
	b := bucket{tokens: 3, refilledAt: t0, expiresAt: t0.Add(time.Hour)}

	got := p.load(b, t0.Add(9999*time.Millisecond))
	if got.tokens != 3 || !got.refilledAt.Equal(t0) {
		t.Fatalf("before one interval: %+v", got)
	}
	got = p.load(b, t0.Add(25*time.Second))
	if got.tokens != 13 || !got.refilledAt.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("two intervals: %+v", got)
	}
	// Capped, but refilledAt still moves by whole intervals only.
	got = p.load(b, t0.Add(57*time.Second))
	if got.tokens != 20 || !got.refilledAt.Equal(t0.Add(50*time.Second)) {
		t.Fatalf("capped: %+v", got)
	}
}

func TestLoadClampsAndExpires(t *testing.T) {
	p := policy{capacity: 5, refill: 1, interval: time.Second}
	// Capacity lowered since the row was written.
	got := p.load(bucket{tokens: 90, refilledAt: t0, expiresAt: t0.Add(time.Hour)}, t0)
	if got.tokens != 5 {
		t.Fatalf("not clamped: %+v", got)
	}
	// Clock behind refilledAt: nothing added, nothing moved.
	b := bucket{tokens: 1, refilledAt: t0, expiresAt: t0.Add(time.Hour)}
	if got := p.load(b, t0.Add(-time.Hour)); !got.same(b) {
		t.Fatalf("late clock changed the bucket: %+v", got)
	}
	// Past expiresAt: a fresh bucket, grid restarting now.
	now := t0.Add(2 * time.Hour)
	if got := p.load(b, now); !got.same(p.fresh(now)) {
		t.Fatalf("expired row is not fresh: %+v", got)
	}
}

func TestTakeAndRetryAfter(t *testing.T) {
	p := policy{capacity: 10, refill: 3, interval: time.Second}
	b := bucket{tokens: 1, refilledAt: t0, expiresAt: t0.Add(30 * time.Second)}
	now := t0.Add(400 * time.Millisecond)

	nb, r := p.take(b, now, 8)
	if r.Allowed || !nb.same(b) {
		t.Fatalf("cost 8 of 1 allowed or changed the bucket: %+v %+v", r, nb)
	}
	// Need 7 more: 3 refills, the third at t0+3s, which is 2.6s from now.
	if r.RetryAfter != 2600*time.Millisecond || r.Remaining != 1 {
		t.Fatalf("retry: %+v", r)
	}
	nb, r = p.take(b, now, 1)
	if !r.Allowed || r.Remaining != 0 || nb.tokens != 0 || r.RetryAfter != 0 {
		t.Fatalf("take 1: %+v %+v", r, nb)
	}
	// Full after 4 refills, at t0+4s: 3.6s from now; the row expires at the
	// next whole minute.
	if r.ResetAfter != 3600*time.Millisecond || !nb.expiresAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("reset: %+v %+v", r, nb)
	}
}

func TestExpiryOnlyMovesForward(t *testing.T) {
	p := policy{capacity: 10, refill: 10, interval: time.Second}
	later := t0.Add(time.Hour)
	b := bucket{tokens: 10, refilledAt: t0, expiresAt: later}
	nb, _ := p.take(b, t0, 1)
	if !nb.expiresAt.Equal(later) {
		t.Fatalf("expiresAt moved back to %v", nb.expiresAt)
	}
}

// Gaps longer than a time.Duration's ~292 years still count every whole
// interval: a century-long Interval after 500 years adds 5 refills.
func TestLongGaps(t *testing.T) {
	year := 365 * 24 * time.Hour
	p := policy{capacity: 100, refill: 1, interval: 100 * year}
	b := bucket{tokens: 0, refilledAt: t0, expiresAt: maxTime}
	now := t0.AddDate(500, 0, 1)
	got := p.load(b, now)
	want := int64(now.Sub(t0) / p.interval) // saturated Sub: 2
	if want != 2 || got.tokens != 5 {
		t.Fatalf("tokens %d after 500 years (a saturating Sub counts %d)", got.tokens, want)
	}
	want500 := t0
	for range 5 {
		want500 = want500.Add(100 * year)
	}
	if !got.refilledAt.Equal(want500) {
		t.Fatalf("refilledAt %v", got.refilledAt)
	}
	if n := intervalsBetween(t0, t0.AddDate(1000, 0, 0), time.Microsecond); n <= 0 {
		t.Fatalf("intervals over 1000 years of 1µs: %d", n)
	}
}

func TestSaturation(t *testing.T) {
	p := policy{capacity: math.MaxInt64, refill: math.MaxInt64 / 2, interval: 100 * 365 * 24 * time.Hour}
	b := bucket{tokens: 0, refilledAt: t0, expiresAt: maxTime}
	got := p.load(b, t0.Add(250*365*24*time.Hour))
	if got.tokens != math.MaxInt64-1 {
		t.Fatalf("tokens %d", got.tokens)
	}
	nb, r := p.take(b, t0, math.MaxInt64)
	if r.Allowed || nb.tokens != 0 || r.RetryAfter <= 0 {
		t.Fatalf("%+v", r)
	}
	nb, r = p.give(b, t0, math.MaxInt64)
	if nb.tokens != math.MaxInt64 || r.Remaining != math.MaxInt64 {
		t.Fatalf("give: %+v", r)
	}
	if addSat(math.MaxInt64, 1) != math.MaxInt64 || addSat(math.MinInt64, -1) != math.MinInt64 {
		t.Fatal("addSat")
	}
	if mulSat(math.MaxInt64, 2) != math.MaxInt64 || mulSat(0, math.MaxInt64) != 0 {
		t.Fatal("mulSat")
	}
	if !timeAddSat(t0, math.MaxInt64).Equal(maxTime) {
		t.Fatal("timeAddSat")
	}
}

// model is a plain step-by-step token bucket: it advances one interval at a
// time and finds waits by stepping, with none of bucket.go's arithmetic.
type model struct {
	capacity, refill int64
	interval         time.Duration
	tokens           int64
	refilledAt       time.Time
	expiresAt        time.Time
}

func (m *model) advance(now time.Time) {
	if !now.Before(m.expiresAt) {
		m.tokens, m.refilledAt, m.expiresAt = m.capacity, now, now
		return
	}
	for !now.Before(m.refilledAt.Add(m.interval)) {
		m.refilledAt = m.refilledAt.Add(m.interval)
		m.tokens += m.refill
		if m.tokens > m.capacity {
			m.tokens = m.capacity
		}
	}
}

// waitFor steps refills forward until the bucket holds want tokens.
func (m *model) waitFor(now time.Time, want int64) time.Duration {
	tokens, at := m.tokens, m.refilledAt
	for tokens < want {
		at = at.Add(m.interval)
		tokens += m.refill
	}
	if tokens == m.tokens {
		return 0
	}
	return at.Sub(now)
}

func (m *model) take(now time.Time, cost int64) Result {
	m.advance(now)
	if m.tokens < cost {
		return Result{Limit: m.capacity, Remaining: m.tokens, RetryAfter: m.waitFor(now, cost), ResetAfter: m.waitFor(now, m.capacity)}
	}
	m.tokens -= cost
	r := Result{Allowed: true, Limit: m.capacity, Remaining: m.tokens, ResetAfter: m.waitFor(now, m.capacity)}
	full := now.Add(r.ResetAfter)
	exp := full.Truncate(time.Minute)
	if exp.Before(full) {
		exp = exp.Add(time.Minute)
	}
	if exp.After(m.expiresAt) {
		m.expiresAt = exp
	}
	return r
}

// FuzzRefillMath runs a sequence of checks through the bucket math and the
// step-by-step model and requires the same result at every step.
func FuzzRefillMath(f *testing.F) {
	f.Add(uint16(20), uint16(5), uint16(10000), []byte{0, 5, 10, 1, 0, 1, 200, 18, 50, 3})
	f.Add(uint16(3), uint16(1), uint16(10000), []byte{99, 1, 99, 1, 99, 1, 70, 1, 70, 1})
	f.Add(uint16(1), uint16(1), uint16(1), []byte{255, 1, 0, 1, 255, 1})
	f.Fuzz(func(t *testing.T, capacity16, refill16, intervalMs uint16, steps []byte) {
		capacity, refill := 1+int64(capacity16%1000), 1+int64(refill16%1000)
		p := policy{capacity: capacity, refill: refill, interval: time.Duration(1+int(intervalMs)) * time.Millisecond}
		m := &model{capacity: capacity, refill: refill, interval: p.interval}
		now := t0
		b := p.fresh(now)
		m.tokens, m.refilledAt, m.expiresAt = b.tokens, b.refilledAt, b.expiresAt
		for i := 0; i+1 < len(steps); i += 2 {
			// Each step: time moves by steps[i] tenths of an interval
			// (sometimes backwards), then a check of some cost.
			dt := time.Duration(steps[i]) * p.interval / 10
			if steps[i]%17 == 16 {
				dt = -dt
			}
			now = now.Add(dt).Truncate(time.Microsecond)
			cost := 1 + int64(steps[i+1])%capacity
			want := m.take(now, cost)

			var got Result
			b, got = p.take(p.load(b, now), now, cost)
			if got != want {
				t.Fatalf("step %d (now +%v, cost %d): got %+v, model %+v", i/2, now.Sub(t0), cost, got, want)
			}
			if b.tokens != m.tokens || !b.refilledAt.Equal(m.refilledAt) || !b.expiresAt.Equal(m.expiresAt) {
				t.Fatalf("step %d: bucket %+v, model %+v", i/2, b, m)
			}
		}
	})
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
		p := policy{capacity: capacity, refill: refill, interval: time.Duration(interval)}
		err := p.validateCost(cost)
		if err != nil {
			if !errors.Is(err, ErrInvalidCost) && !errors.Is(err, ErrCostExceedsCapacity) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		b, r := p.take(p.fresh(t0), t0, cost)
		if !r.Allowed || b.tokens != capacity-cost || r.RetryAfter != 0 || r.ResetAfter < 0 {
			t.Fatalf("fresh bucket, cost %d: %+v %+v", cost, b, r)
		}
		later := p.load(b, t0.Add(time.Duration(interval)))
		if later.tokens < b.tokens || later.tokens > capacity {
			t.Fatalf("refill out of range: %+v", later)
		}
	})
}

package account

import (
	"math"
	"math/big"
	"slices"
	"testing"
	"time"
)

func TestLoadRefillsOnTheGrid(t *testing.T) {
	p := gridPolicy(20, 5, 10*time.Second)
	b := bucket{Tokens: 3, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour)}

	got := p.load(b, t0.Add(9999*time.Millisecond))
	if got.Tokens != 3 || !got.RefilledAt.Equal(t0) {
		t.Fatalf("before one interval: %+v", got)
	}
	got = p.load(b, t0.Add(25*time.Second))
	if got.Tokens != 13 || !got.RefilledAt.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("two intervals: %+v", got)
	}
	// Capped, but RefilledAt still moves by whole intervals only.
	got = p.load(b, t0.Add(57*time.Second))
	if got.Tokens != 20 || !got.RefilledAt.Equal(t0.Add(50*time.Second)) {
		t.Fatalf("capped: %+v", got)
	}
}

func TestLoadClampsAndExpires(t *testing.T) {
	p := gridPolicy(5, 1, time.Second)
	// Capacity lowered since the row was written.
	got := p.load(bucket{Tokens: 90, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour)}, t0)
	if got.Tokens != 5 {
		t.Fatalf("not clamped: %+v", got)
	}
	// Clock behind RefilledAt: nothing added, nothing moved.
	b := bucket{Tokens: 1, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if got := p.load(b, t0.Add(-time.Hour)); !got.same(b) {
		t.Fatalf("late clock changed the bucket: %+v", got)
	}
	// Past ExpiresAt: a fresh bucket, full as of the grid's latest boundary.
	now := t0.Add(2*time.Hour + 300*time.Millisecond)
	if got := p.load(b, now); !got.same(p.fresh(now)) || got.Tokens != 5 || !got.RefilledAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("expired row is not fresh: %+v", got)
	}
}

// A new bucket's grid is the policy's, phased at the Unix epoch, not the
// first check's: a check at 12:00:07 against 1 per 10s refills at 12:00:10.
func TestBucketFreshKeepsThePhase(t *testing.T) {
	p := gridPolicy(1, 1, 10*time.Second)
	now := t0.Add(7 * time.Second)
	b := p.fresh(now)
	if b.Tokens != 1 || !b.RefilledAt.Equal(t0) {
		t.Fatalf("fresh: %+v", b)
	}
	b, r := p.take(b, now, 1)
	if !r.Allowed || r.ResetAfter != 3*time.Second || !b.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("take: %+v %+v", r, b)
	}
	// The old grid would have started at the first check: 12:00:17.
	if got := p.load(b, t0.Add(10*time.Second)); got.Tokens != 1 || !got.RefilledAt.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("refill at 12:00:10: %+v", got)
	}
}

func TestTakeAndRetryAfter(t *testing.T) {
	p := gridPolicy(10, 3, time.Second)
	b := bucket{Tokens: 1, RefilledAt: t0, ExpiresAt: t0.Add(30 * time.Second)}
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
	if !r.Allowed || r.Remaining != 0 || nb.Tokens != 0 || r.RetryAfter != 0 {
		t.Fatalf("take 1: %+v %+v", r, nb)
	}
	// Full after 4 refills, at t0+4s: 3.6s from now; the row expires at the
	// next whole minute.
	if r.ResetAfter != 3600*time.Millisecond || !nb.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("reset: %+v %+v", r, nb)
	}
}

func TestExpiryOnlyMovesForward(t *testing.T) {
	p := gridPolicy(10, 10, time.Second)
	later := t0.Add(time.Hour)
	b := bucket{Tokens: 10, RefilledAt: t0, ExpiresAt: later}
	nb, _ := p.take(b, t0, 1)
	if !nb.ExpiresAt.Equal(later) {
		t.Fatalf("ExpiresAt moved back to %v", nb.ExpiresAt)
	}
}

// Gaps longer than a time.Duration's ~292 years still count every boundary:
// a century-long Interval (of 365-day years, from the Unix epoch) after 500
// years adds 5 refills.
func TestLongGaps(t *testing.T) {
	year := 365 * 24 * time.Hour
	p := gridPolicy(100, 1, 100*year)
	b0 := p.fresh(t0).RefilledAt
	if !b0.Equal(unixEpoch) {
		t.Fatalf("floor of %v: %v", t0, b0)
	}
	b := bucket{Tokens: 0, RefilledAt: b0, ExpiresAt: MaxTime}
	now := b0.AddDate(500, 0, 1)
	got := p.load(b, now)
	want := int64(now.Sub(b0) / 100 / year) // saturated Sub: 2
	if want != 2 || got.Tokens != 5 {
		t.Fatalf("Tokens %d after 500 years (a saturating Sub counts %d)", got.Tokens, want)
	}
	want500 := b0
	for range 5 {
		want500 = want500.Add(100 * year)
	}
	if !got.RefilledAt.Equal(want500) {
		t.Fatalf("RefilledAt %v", got.RefilledAt)
	}
	later := t0.AddDate(1000, 0, 0)
	if n, want := (grid{interval: time.Microsecond}).Count(t0, later), (later.Unix()-t0.Unix())*1e6; n != want {
		t.Fatalf("microseconds over 1000 years: %d, want %d", n, want)
	}
	if n := (grid{interval: 1}).Count(time.Time{}, MaxTime); n != math.MaxInt64 {
		t.Fatalf("nanoseconds over 10000 years: %d, want saturation", n)
	}
}

func TestBucketSaturation(t *testing.T) {
	p := gridPolicy(math.MaxInt64, math.MaxInt64/2, 100*365*24*time.Hour)
	b0 := p.fresh(t0).RefilledAt
	b := bucket{Tokens: 0, RefilledAt: b0, ExpiresAt: MaxTime}
	got := p.load(b, b0.Add(250*365*24*time.Hour))
	if got.Tokens != math.MaxInt64-1 {
		t.Fatalf("Tokens %d", got.Tokens)
	}
	nb, r := p.take(b, t0, math.MaxInt64)
	if r.Allowed || nb.Tokens != 0 || r.RetryAfter <= 0 {
		t.Fatalf("%+v", r)
	}
	nb, r = p.give(b, t0, math.MaxInt64)
	if nb.Tokens != math.MaxInt64 || r.Remaining != math.MaxInt64 {
		t.Fatalf("give: %+v", r)
	}
	// The wait for a refill 2^63 nanoseconds away saturates.
	p = gridPolicy(math.MaxInt64, 1, math.MaxInt64/2+1)
	b = bucket{Tokens: 0, RefilledAt: p.fresh(t0).RefilledAt, ExpiresAt: MaxTime}
	if _, r := p.take(b, t0, 3); r.RetryAfter != math.MaxInt64 || r.ResetAfter != math.MaxInt64 {
		t.Fatalf("saturated waits: %+v", r)
	}
	if AddSat(math.MaxInt64, 1) != math.MaxInt64 || AddSat(math.MinInt64, -1) != math.MinInt64 {
		t.Fatal("addSat")
	}
	if mulSat(math.MaxInt64, 2) != math.MaxInt64 || mulSat(0, math.MaxInt64) != 0 {
		t.Fatal("mulSat")
	}
	if !timeAddSat(MaxTime.Add(-time.Hour), 2*time.Hour).Equal(MaxTime) || !timeAddSat(MaxTime, 0).Equal(MaxTime) {
		t.Fatal("timeAddSat")
	}
	// 2^63-1ns from year 1 is year 293, not MaxTime (a saturated Sub).
	if got := timeAddSat(time.Time{}, math.MaxInt64); got.Year() != 293 {
		t.Fatalf("timeAddSat from year 1: %v", got)
	}
}

func TestBucketHorizon(t *testing.T) {
	p := gridPolicy(10, 3, time.Second)
	for cost, want := range map[int64]time.Duration{1: time.Second, 3: time.Second, 4: 2 * time.Second, 10: 4 * time.Second, 99: 4 * time.Second} {
		if got := p.horizon(cost); got != want {
			t.Errorf("grid, cost %d: %v, want %v", cost, got, want)
		}
		// An upper bound of the first check's ResetAfter, wherever it falls.
		for _, now := range []time.Time{t0, t0.Add(time.Nanosecond), t0.Add(999 * time.Millisecond)} {
			if _, r := p.take(p.fresh(now), now, min(cost, 10)); r.ResetAfter > p.horizon(cost) {
				t.Errorf("cost %d at %v: reset %v after horizon %v", cost, now, r.ResetAfter, p.horizon(cost))
			}
		}
	}
	cal := policy{Capacity: 10, Refill: 5, Schedule: cal{Every: Month}.at(time.Time{})}
	if got := cal.horizon(6); got != 2*(31*24+1)*time.Hour {
		t.Errorf("calendar: %v", got)
	}
	if got := gridPolicy(math.MaxInt64, 1, time.Hour).horizon(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("saturation: %v", got)
	}
}

// model is a plain step-by-step token bucket that never forgets: it starts
// full at its first check, as of the latest boundary of its Schedule, walks
// the boundaries one at a time (each adds refill, capped), and finds waits by
// stepping, with none of bucket.go's arithmetic. Its row never expires, so
// comparing it with the policy's bucket, whose row expires and may be
// deleted, shows that expiry and cleanup never change a decision.
type model struct {
	Capacity, Refill int64
	bounds           modelSchedule
	started          bool
	Tokens           int64
	RefilledAt       time.Time
	ExpiresAt        time.Time
}

// modelSchedule is a Schedule as the models know it.
type modelSchedule interface {
	Floor(t time.Time) time.Time // the latest boundary at or before t
	next(b time.Time) time.Time  // the boundary after boundary b
}

// modelGrid steps a grid of interval from the Unix epoch, in exact
// nanoseconds (big integers: a time.Duration or UnixNano reaches only
// 1678-2262).
type modelGrid struct{ interval time.Duration }

func (g modelGrid) Floor(t time.Time) time.Time {
	ns := new(big.Int).Add(new(big.Int).Mul(big.NewInt(t.Unix()), big.NewInt(1e9)), big.NewInt(int64(t.Nanosecond())))
	iv := big.NewInt(int64(g.interval))
	r := new(big.Int).Mod(ns, iv) // Euclidean: 0 <= r < iv
	return t.Add(-time.Duration(r.Int64()))
}

func (g modelGrid) next(b time.Time) time.Time { return b.Add(g.interval) }

func (m *model) advance(now time.Time) {
	if !m.started {
		m.started = true
		m.Tokens, m.RefilledAt, m.ExpiresAt = m.Capacity, m.bounds.Floor(now), now
		return
	}
	for next := m.bounds.next(m.RefilledAt); !now.Before(next); next = m.bounds.next(m.RefilledAt) {
		m.RefilledAt = next
		m.Tokens += m.Refill
		if m.Tokens > m.Capacity {
			m.Tokens = m.Capacity
		}
	}
}

// fullAt steps refills forward until the bucket holds want Tokens (more
// than it has): the boundary that brings them, an instant (a wait from now
// saturates past 292 years).
func (m *model) fullAt(want int64) time.Time {
	Tokens, at := m.Tokens, m.RefilledAt
	for Tokens < want {
		at = m.bounds.next(at)
		Tokens += m.Refill
	}
	return at
}

// waitFor is how long until the bucket holds want Tokens.
func (m *model) waitFor(now time.Time, want int64) time.Duration {
	if m.Tokens >= want {
		return 0
	}
	return m.fullAt(want).Sub(now)
}

// take checks cost at now. A denied check writes nothing: the refills it
// saw are not kept (they matter when the clock then moves backwards).
func (m *model) take(now time.Time, cost int64) Result {
	saved := *m
	m.advance(now)
	if m.Tokens < cost {
		r := Result{Limit: m.Capacity, Remaining: m.Tokens, RetryAfter: m.waitFor(now, cost), ResetAfter: m.waitFor(now, m.Capacity)}
		*m = saved
		return r
	}
	m.Tokens -= cost
	r := Result{Allowed: true, Limit: m.Capacity, Remaining: m.Tokens, ResetAfter: m.waitFor(now, m.Capacity)}
	full := now
	if m.Tokens < m.Capacity {
		full = m.fullAt(m.Capacity)
	}
	if full.After(MaxTime) {
		full = MaxTime
	}
	exp := full.Truncate(time.Minute)
	if exp.Before(full) {
		exp = exp.Add(time.Minute)
	}
	if exp.After(m.ExpiresAt) {
		m.ExpiresAt = exp
	}
	return r
}

// store is the buckets table as far as one key goes: its row or none, and a
// cleanup that deletes the row once it has expired.
type store struct {
	row     *bucket
	cleanup bool
}

// check runs one check as the engine does: cleanup (if it runs) first, a
// missing row read as a placeholder, the new row written when allowed.
func (s *store) check(p policy, now time.Time, cost int64) (bucket, Result) {
	if s.cleanup && s.row != nil && !now.Before(s.row.ExpiresAt) {
		s.row = nil
	}
	stored := bucket{} // the placeholder a check inserts
	if s.row != nil {
		stored = *s.row
	}
	b, r := p.take(p.load(stored, now), now, cost)
	if r.Allowed {
		s.row = &b
	}
	return b, r
}

// runModel runs checks through the policy (its row kept in st) and the
// model from start: each pair of steps moves the clock by steps[i] tenths of
// unit (backwards when steps[i]%17 == 16), then checks a cost from
// steps[i+1]. At most 128 checks.
func runModel(t *testing.T, p policy, m *model, st *store, start time.Time, unit time.Duration, steps []byte) {
	t.Helper()
	now := start
	for i := 0; i+1 < len(steps) && i < 256; i += 2 {
		dt := time.Duration(steps[i]) * unit / 10
		if steps[i]%17 == 16 {
			dt = -dt
		}
		now = now.Add(dt).Truncate(time.Microsecond)
		cost := 1 + int64(steps[i+1])%p.Capacity
		want := m.take(now, cost)
		b, got := st.check(p, now, cost)
		if got != want {
			t.Fatalf("step %d (now %v, cost %d, cleanup %v): got %+v, model %+v", i/2, now, cost, st.cleanup, got, want)
		}
		if got.Allowed && (b.Tokens != m.Tokens || !b.RefilledAt.Equal(m.RefilledAt) || !b.ExpiresAt.Equal(m.ExpiresAt)) {
			t.Fatalf("step %d (now %v, cleanup %v): bucket %+v, model %+v", i/2, now, st.cleanup, b, m)
		}
	}
}

// FuzzRefillMath runs a sequence of checks through the bucket math and the
// step-by-step model and requires the same result at every step, on a grid
// (sched 0) or on one of the calendars of fuzzCalendars, once with the
// bucket's row only expiring and once with a cleanup deleting it when it has.
func FuzzRefillMath(f *testing.F) {
	f.Add(uint16(20), uint16(5), uint16(10000), uint8(0), []byte{0, 5, 10, 1, 0, 1, 200, 18, 50, 3})
	f.Add(uint16(3), uint16(1), uint16(10000), uint8(0), []byte{99, 1, 99, 1, 99, 1, 70, 1, 70, 1})
	f.Add(uint16(1), uint16(1), uint16(1), uint8(0), []byte{255, 1, 0, 1, 255, 1})
	f.Add(uint16(5), uint16(2), uint16(7001), uint8(1+len(fuzzCalendars)), []byte{9, 3, 70, 1, 255, 4, 13, 2})
	f.Add(uint16(999), uint16(0), uint16(364), uint8(2*(1+len(fuzzCalendars))), append([]byte{0, 255, 0, 255}, slices.Repeat([]byte{255, 1}, 14)...)) // centuries to fill
	for i := range fuzzCalendars {
		f.Add(uint16(1000), uint16(400), uint16(0), uint8(1+i), []byte{3, 255, 7, 200, 12, 100, 33, 50, 16, 9, 9, 255, 40, 1, 11, 17})
	}
	f.Fuzz(func(t *testing.T, capacity16, refill16, intervalMs uint16, sched uint8, steps []byte) {
		capacity, refill := 1+int64(capacity16%1000), 1+int64(refill16%1000)
		var (
			p     policy
			ms    modelSchedule
			start = t0
			unit  = time.Duration(1+int(intervalMs)) * time.Millisecond
		)
		if k := int(sched) % (1 + len(fuzzCalendars)); k == 0 {
			if sched%4 >= 2 {
				// Intervals of days to a year: a bucket may take longer to
				// fill than a time.Duration reaches.
				unit = time.Duration(1+int(intervalMs)%365) * 24 * time.Hour
			}
			p, ms = gridPolicy(capacity, refill, unit), modelGrid{interval: unit}
			if sched%2 == 1 {
				start = time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC) // past int64 nanoseconds
			}
		} else {
			fc := fuzzCalendars[k-1]
			p = policy{Capacity: capacity, Refill: refill, Schedule: fc.cal.at(fc.key)}
			ms, start, unit = fc.model(t), fc.start, fc.unit
			start = start.Add(time.Duration(intervalMs) * unit / 1000)
		}
		for _, cleanup := range []bool{false, true} {
			runModel(t, p, &model{Capacity: capacity, Refill: refill, bounds: ms}, &store{cleanup: cleanup}, start, unit, steps)
		}
	})
}

// A bucket full again further away than a time.Duration reaches (292
// years) keeps its row until then: its expiry is the instant of the refill
// that fills it, not now plus a saturated wait (issue 40: the row expired in
// 2318 and then read as full, where the grid gives 3 until 2369).
func TestExpiryBeyondDurations(t *testing.T) {
	century := 100 * 365 * 24 * time.Hour
	p := Policy{Capacity: 10, Refill: 1, Schedule: Grid(century)}
	s, c, err := Apply(p, State{}, t0, Op{Kind: OpCharge, Amount: 10})
	if err != nil || !c.Allowed {
		t.Fatalf("first charge: %+v %v", c, err)
	}
	full := p.Schedule.Add(p.Schedule.Floor(t0), 10)
	if s.Bucket.ExpiresAt.Before(full) {
		t.Fatalf("expires %v, full only at %v", s.Bucket.ExpiresAt, full)
	}
	year := func(y int) time.Time { return time.Date(y, 6, 1, 0, 0, 0, 0, time.UTC) }
	for at, want := range map[time.Time]int64{year(2318): 3, year(2319): 3, year(2368): 3, year(2370): 4, year(2970): 10} {
		if o := Look(p, s, at, 10); o.Remaining != want || o.Allowed != (want == 10) {
			t.Errorf("at %v: %+v, want %d left", at.Year(), o, want)
		}
	}
	// A monthly quota refilled by 1: 10,000 months to fill, and 100,000,
	// past MaxTime.
	m := Policy{Capacity: 10000, Refill: 1, Schedule: Calendar(Month, time.UTC, time.Time{})}
	s, _, err = Apply(m, State{}, t0, Op{Kind: OpCharge, Amount: 10000})
	if want := time.Date(2859, 5, 1, 0, 0, 0, 0, time.UTC); err != nil || !s.Bucket.ExpiresAt.Equal(want) {
		t.Fatalf("monthly: expires %v %v, want %v", s.Bucket.ExpiresAt, err, want)
	}
	if o := Look(m, s, year(2400), 1); o.Remaining != m.Schedule.Count(t0, year(2400)) {
		t.Fatalf("monthly in 2400: %+v", o)
	}
	m.Capacity = 100000
	if s, _, err = Apply(m, State{}, t0, Op{Kind: OpCharge, Amount: 100000}); err != nil || !s.Bucket.ExpiresAt.Equal(MaxTime) {
		t.Fatalf("monthly past MaxTime: expires %v %v", s.Bucket.ExpiresAt, err)
	}
}

package account

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the tests' zones, also where the system has no tz database
)

func zone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

var (
	berlin    = zone("Europe/Berlin")
	newYork   = zone("America/New_York")
	lordHowe  = zone("Australia/Lord_Howe") // DST of 30 minutes, at 02:00
	apia      = zone("Pacific/Apia")        // skipped 30 December 2011
	kwaj      = zone("Pacific/Kwajalein")   // skipped 21 August 1993
	testZones = []*time.Location{time.UTC, berlin, newYork, lordHowe, apia, kwaj}
)

// modelList is a Schedule's boundaries, enumerated: the models' view of a
// calendar.
type modelList []time.Time

func (l modelList) search(t time.Time) int {
	return sort.Search(len(l), func(i int) bool { return l[i].After(t) })
}

// floor is the latest boundary at or before t.
func (l modelList) Floor(t time.Time) time.Time {
	i := l.search(t) - 1
	if i < 0 {
		panic(fmt.Sprintf("model: %v before the first boundary %v", t, l[0]))
	}
	return l[i]
}

// next is the first boundary after b.
func (l modelList) next(b time.Time) time.Time {
	i := l.search(b)
	if i == len(l) {
		panic(fmt.Sprintf("model: %v after the last boundary %v", b, l[len(l)-1]))
	}
	return l[i]
}

// modelBoundaries enumerates the boundaries of c (with a per-key anchor,
// when not zero) from the first of year from to the last before year to, by
// stepping through the calendar's days or months in UTC (AddDate) and making
// each boundary with time.Date in the zone: every day, the days of the
// anchor's weekday, or each month's anchor day clamped to the month's last. A
// boundary that is not after the previous one (a day the zone skipped) is
// moved to a nanosecond after it.
func modelBoundaries(c cal, key time.Time, from, to int) modelList {
	loc := c.Location
	if loc == nil {
		loc = time.UTC
	}
	a := key
	if a.IsZero() {
		a = c.Anchor
	}
	hour, minute, sec, nsec, day, weekday := 0, 0, 0, 0, 1, time.Monday
	if !a.IsZero() {
		a = a.In(loc)
		hour, minute, sec = a.Clock()
		nsec, day, weekday = a.Nanosecond()/1000*1000, a.Day(), a.Weekday()
	}
	var days []time.Time // the boundaries' dates, at noon UTC
	if c.Every == Month {
		for m := time.Date(from, 1, 1, 12, 0, 0, 0, time.UTC); m.Year() < to; m = m.AddDate(0, 1, 0) {
			last := time.Date(m.Year(), m.Month()+1, 0, 12, 0, 0, 0, time.UTC).Day()
			days = append(days, m.AddDate(0, 0, min(day, last)-1))
		}
	} else {
		for d := time.Date(from, 1, 1, 12, 0, 0, 0, time.UTC); d.Year() < to; d = d.AddDate(0, 0, 1) {
			if c.Every == Day || d.Weekday() == weekday {
				days = append(days, d)
			}
		}
	}
	var l modelList
	for _, d := range days {
		b := time.Date(d.Year(), d.Month(), d.Day(), hour, minute, sec, nsec, loc)
		if len(l) > 0 && !b.After(l[len(l)-1]) {
			b = l[len(l)-1].Add(1)
		}
		l = append(l, b)
	}
	return l
}

func describe(c cal, key time.Time) string {
	s := fmt.Sprintf("%v in %v", c.Every, c.Location)
	if !c.Anchor.IsZero() {
		s += fmt.Sprintf(", anchor %v", c.Anchor.In(c.Location))
	}
	if !key.IsZero() {
		s += fmt.Sprintf(", key's anchor %v", key.In(c.Location))
	}
	return s
}

// checkAgainstModel compares floor, count and add of s with the enumerated
// boundaries l at random times within them, at the boundaries and a
// nanosecond around them.
func checkAgainstModel(t *testing.T, name string, s Schedule, l modelList, rng *rand.Rand) {
	t.Helper()
	for i := 1; i < len(l); i++ {
		if !l[i].After(l[i-1]) {
			t.Fatalf("%s: model not increasing at %v", name, l[i])
		}
	}
	lo, hi := l[1].UnixNano(), l[len(l)-2].UnixNano()
	randTime := func() (time.Time, int) {
		var tt time.Time
		switch rng.IntN(4) {
		case 0: // a boundary
			tt = l[1+rng.IntN(len(l)-2)]
		case 1: // just before or after one
			tt = l[1+rng.IntN(len(l)-2)].Add(time.Duration(rng.IntN(3) - 1))
		default:
			tt = time.Unix(0, lo+rng.Int64N(hi-lo)).In(testZones[rng.IntN(len(testZones))])
		}
		return tt, l.search(tt) - 1 // the index of its floor
	}
	for range 500 {
		tt, i := randTime()
		if got := s.Floor(tt); !got.Equal(l[i]) {
			t.Fatalf("%s: floor(%v) = %v, model %v", name, tt, got, l[i])
		}
		// count from a boundary, from a time between two (the boundaries
		// after it count), and backwards.
		u, j := randTime()
		if got, want := s.Count(l[i], u), int64(max(j-i, 0)); got != want {
			t.Fatalf("%s: count(%v, %v) = %d, model %d", name, l[i], u, got, want)
		}
		if got, want := s.Count(tt, u), int64(max(j-i, 0)); got != want {
			t.Fatalf("%s: count(%v, %v) = %d, model %d", name, tt, u, got, want)
		}
		n := rng.IntN(len(l) - 1 - i)
		if got := s.Add(l[i], int64(n)); !got.Equal(l[i+n]) {
			t.Fatalf("%s: add(%v, %d) = %v, model %v", name, l[i], n, got, l[i+n])
		}
		if n > 0 {
			if got := s.Add(tt, int64(n)); !got.Equal(l[i+n]) {
				t.Fatalf("%s: add(%v, %d) = %v, model %v", name, tt, n, got, l[i+n])
			}
		}
	}
}

// Calendar math against the enumerated model: zones with DST of an hour and
// of 30 minutes, with skipped days, months of 28-31 days and leap years
// (2000, 2024, 2028; 1900 and 2100 are not), absolute and per-key anchors,
// anchors in a DST gap or fold and past a month's end.
func TestCalendarAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 1))
	years := map[Period][2]int{Day: {2010, 2031}, Week: {1985, 2040}, Month: {1895, 2106}}
	for _, loc := range testZones {
		anchors := []time.Time{
			{}, // midnight, Mondays, the 1st
			time.Date(2024, 1, 31, 0, 0, 0, 0, loc),
			time.Date(2026, 3, 29, 2, 30, 0, 0, loc),        // Sunday; 02:30 missing in Berlin that day
			time.Date(2026, 11, 1, 1, 30, 0, 0, loc),        // Sunday; 01:30 twice in New York that day
			time.Date(2026, 10, 4, 2, 15, 0, 0, loc),        // Sunday; missing in Lord Howe that day
			time.Date(2025, 5, 30, 23, 59, 59, 999999, loc), // Friday
			time.Date(2011, 12, 30, 0, 0, 0, 0, time.UTC),   // read in loc
		}
		for range 2 {
			anchors = append(anchors, time.Date(2026, time.Month(1+rng.IntN(12)), 1+rng.IntN(31),
				rng.IntN(24), rng.IntN(60), rng.IntN(60), rng.IntN(1e9), loc))
		}
		for _, every := range []Period{Day, Week, Month} {
			for i, anchor := range anchors {
				// Each anchor both as the calendar's and as a key's (over
				// another calendar anchor, which it replaces).
				abs := cal{Every: every, Location: loc, Anchor: anchor}
				perKey := cal{Every: every, Location: loc, Anchor: anchors[(i+1)%len(anchors)]}
				if anchor.IsZero() {
					perKey.Anchor = time.Time{}
				}
				l := modelBoundaries(abs, time.Time{}, years[every][0], years[every][1])
				checkAgainstModel(t, describe(abs, time.Time{}), abs.at(time.Time{}), l, rng)
				checkAgainstModel(t, describe(perKey, anchor), perKey.at(anchor), l, rng)
			}
		}
	}
}

func TestCalendarFacts(t *testing.T) {
	day := func(loc *time.Location, y int, m time.Month, d int) time.Duration {
		s := cal{Every: Day, Location: loc}.at(time.Time{})
		b := time.Date(y, m, d, 0, 0, 0, 0, loc)
		if !s.Floor(b).Equal(b) {
			t.Fatalf("%v is not a boundary", b)
		}
		return s.Add(b, 1).Sub(b)
	}
	for _, c := range []struct {
		loc  *time.Location
		date time.Time
		want time.Duration
	}{
		{berlin, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC), 23 * time.Hour},
		{berlin, time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC), 25 * time.Hour},
		{berlin, time.Date(2026, 10, 26, 0, 0, 0, 0, time.UTC), 24 * time.Hour},
		{newYork, time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), 23 * time.Hour},
		{newYork, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), 25 * time.Hour},
		{lordHowe, time.Date(2026, 10, 4, 0, 0, 0, 0, time.UTC), 23*time.Hour + 30*time.Minute},
		{lordHowe, time.Date(2026, 4, 5, 0, 0, 0, 0, time.UTC), 24*time.Hour + 30*time.Minute},
		{apia, time.Date(2011, 12, 29, 0, 0, 0, 0, time.UTC), time.Nanosecond}, // 30 December never began
		{time.UTC, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC), 24 * time.Hour},
	} {
		y, m, d := c.date.Date()
		if got := day(c.loc, y, m, d); got != c.want {
			t.Errorf("%d-%02d-%02d in %v lasts %v, want %v", y, m, d, c.loc, got, c.want)
		}
	}

	// Apia went from UTC-10 to UTC+14 after 29 December 2011: 31 December
	// began 24 hours after the 29th did.
	a := cal{Every: Day, Location: apia}.at(time.Time{})
	b29 := time.Date(2011, 12, 29, 0, 0, 0, 0, apia)
	if got := a.Add(b29, 2); !got.Equal(time.Date(2011, 12, 31, 0, 0, 0, 0, apia)) || got.Sub(b29) != 24*time.Hour {
		t.Errorf("Apia: %v", got)
	}
	if got := a.Count(b29, b29.Add(time.Hour)); got != 1 {
		t.Errorf("Apia: %d boundaries in the hour after the 29th's, want the 30th's", got)
	}

	// Months anchored on the 31st: the last day of short months, back to
	// the 31st after them; February has 29 days in 2000, 2024 and 2028,
	// not in 1900 or 2100.
	s := cal{Every: Month, Anchor: time.Date(2000, 1, 31, 0, 0, 0, 0, time.UTC)}.at(time.Time{})
	b := s.Floor(time.Date(2028, 1, 31, 0, 0, 0, 0, time.UTC))
	for i, want := range []string{"2028-01-31", "2028-02-29", "2028-03-31", "2028-04-30", "2028-05-31"} {
		if got := s.Add(b, int64(i)).Format(time.DateOnly); got != want {
			t.Errorf("month %d after Jan 31 2028: %s, want %s", i, got, want)
		}
	}
	for y, want := range map[int]int{1900: 28, 2000: 29, 2024: 29, 2026: 28, 2100: 28, 2400: 29} {
		if got := s.Floor(time.Date(y, 3, 1, 0, 0, 0, 0, time.UTC)).Day(); got != want {
			t.Errorf("February %d: boundary on the %d, want %d", y, got, want)
		}
	}

	// Weeks: Mondays at midnight by default; a weekday from the anchor.
	w := cal{Every: Week, Location: berlin}.at(time.Time{})
	if got := w.Floor(time.Date(2026, 5, 17, 23, 0, 0, 0, berlin)); !got.Equal(time.Date(2026, 5, 11, 0, 0, 0, 0, berlin)) {
		t.Errorf("week: %v", got)
	}
	w = cal{Every: Week, Location: berlin}.at(time.Date(2020, 1, 3, 9, 0, 0, 0, berlin)) // a Friday
	if got := w.Add(w.Floor(time.Date(2026, 5, 17, 0, 0, 0, 0, berlin)), 1); !got.Equal(time.Date(2026, 5, 22, 9, 0, 0, 0, berlin)) {
		t.Errorf("key's week: %v", got)
	}

	// The anchor is read in Location: midnight UTC is 01:00 in Berlin.
	c := cal{Every: Day, Location: berlin, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}.at(time.Time{})
	if got := c.Floor(time.Date(2026, 1, 10, 12, 0, 0, 0, berlin)); !got.Equal(time.Date(2026, 1, 10, 1, 0, 0, 0, berlin)) {
		t.Errorf("anchor read in Location: %v", got)
	}
	// ... to the microsecond.
	c = cal{Every: Day, Anchor: time.Date(2026, 1, 1, 0, 0, 0, 1999, time.UTC)}.at(time.Time{})
	if got := c.Floor(t0); got.Nanosecond() != 1000 {
		t.Errorf("anchor's nanoseconds: %v", got)
	}
}

// fuzzCalendar is a calendar that FuzzRefillMath runs checks on, from start,
// the clock moving in tenths of unit, and its enumerated boundaries.
type fuzzCalendar struct {
	cal   cal
	key   time.Time // the key's anchor, or zero
	start time.Time
	unit  time.Duration

	once sync.Once
	list modelList
}

// model is fc's boundaries over the years runModel's clock can reach.
func (fc *fuzzCalendar) model(t *testing.T) modelList {
	fc.once.Do(func() {
		span := int(130*26*fc.unit/(365*24*time.Hour)) + 2
		fc.list = modelBoundaries(fc.cal, fc.key, fc.start.Year()-span, fc.start.Year()+span)
	})
	return fc.list
}

var fuzzCalendars = []*fuzzCalendar{
	{cal: cal{Every: Day}, start: t0, unit: 24 * time.Hour},
	{cal: cal{Every: Day, Location: berlin, Anchor: time.Date(2026, 3, 29, 2, 30, 0, 0, berlin)},
		start: time.Date(2026, 3, 20, 0, 0, 0, 0, berlin), unit: 24 * time.Hour},
	{cal: cal{Every: Day, Location: lordHowe}, key: time.Date(2026, 10, 4, 2, 10, 0, 0, lordHowe),
		start: time.Date(2026, 9, 30, 0, 0, 0, 0, lordHowe), unit: 24 * time.Hour},
	{cal: cal{Every: Day, Location: apia}, start: time.Date(2011, 12, 26, 0, 0, 0, 0, apia), unit: 24 * time.Hour},
	{cal: cal{Every: Week, Location: newYork, Anchor: time.Date(2026, 11, 1, 1, 30, 0, 0, newYork)},
		start: time.Date(2026, 10, 1, 0, 0, 0, 0, newYork), unit: 7 * 24 * time.Hour},
	{cal: cal{Every: Month, Location: berlin}, key: time.Date(2024, 1, 31, 0, 0, 0, 0, berlin),
		start: time.Date(2027, 12, 1, 0, 0, 0, 0, berlin), unit: 30 * 24 * time.Hour},
	{cal: cal{Every: Month, Location: lordHowe, Anchor: time.Date(2026, 1, 29, 2, 15, 0, 0, lordHowe)},
		start: time.Date(2026, 1, 1, 0, 0, 0, 0, lordHowe), unit: 30 * 24 * time.Hour},
	{cal: cal{Every: Month, Location: newYork}, start: time.Date(2099, 12, 1, 0, 0, 0, 0, newYork), unit: 30 * 24 * time.Hour},
}

// A bucket under a calendar against the step-by-step model, over random
// checks (costs, clocks moving by fractions of a period, sometimes
// backwards), with the row only expiring and with a cleanup deleting it
// once expired: the same decisions.
func TestBucketCalendarAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 2))
	for i, fc := range fuzzCalendars {
		for range 40 {
			capacity := 1 + rng.Int64N(100)
			refill := 1 + rng.Int64N(capacity)
			steps := make([]byte, 2*(1+rng.IntN(128)))
			for j := range steps {
				steps[j] = byte(rng.UintN(256))
				if j%2 == 0 && rng.IntN(3) > 0 {
					steps[j] %= 16 // mostly small moves: checks within a period
				}
			}
			t.Run(fmt.Sprintf("%d/%s", i, describe(fc.cal, fc.key)), func(t *testing.T) {
				p := policy{Capacity: capacity, Refill: refill, Schedule: fc.cal.at(fc.key)}
				for _, cleanup := range []bool{false, true} {
					runModel(t, p, &model{Capacity: capacity, Refill: refill, bounds: fc.model(t)}, &store{cleanup: cleanup}, fc.start, fc.unit, steps)
				}
			})
		}
	}
}

// examplePolicy is a quota of capacity with refill per period of cal, for
// the key whose anchor is key (or none).
func examplePolicy(capacity, refill int64, c0 cal, key time.Time) policy {
	return policy{Capacity: capacity, Refill: refill, Schedule: c0.at(key)}
}

// exampleCheck is one check of an example, and what it must report.
type exampleCheck struct {
	at         time.Time
	cost       int64
	allowed    bool
	remaining  int64
	retryAfter time.Duration // when denied
	resetAfter time.Duration
}

// runExample runs the checks, with and without a cleanup deleting the
// key's row whenever it has expired.
func runExample(t *testing.T, p policy, checks []exampleCheck) {
	t.Helper()
	for _, cleanup := range []bool{false, true} {
		st := &store{cleanup: cleanup}
		for _, c := range checks {
			_, r := st.check(p, c.at, c.cost)
			want := Result{Allowed: c.allowed, Limit: p.Capacity, Remaining: c.remaining, RetryAfter: c.retryAfter, ResetAfter: c.resetAfter}
			if r != want {
				t.Errorf("cleanup %v, %v, cost %d: %+v, want %+v", cleanup, c.at, c.cost, r, want)
			}
		}
	}
}

// README: a monthly quota of 1000 renewed on the 31st, which in shorter
// months is their last day (February 29 in 2028, a leap year).
func TestCalendarExampleMonthEnd(t *testing.T) {
	day := 24 * time.Hour
	utc := func(m time.Month, d, h int) time.Time { return time.Date(2028, m, d, h, 0, 0, 0, time.UTC) }
	monthEnd := cal{Every: Month, Anchor: time.Date(2028, 1, 31, 0, 0, 0, 0, time.UTC)}
	runExample(t, examplePolicy(1000, 1000, monthEnd, time.Time{}), []exampleCheck{
		{utc(1, 31, 10), 1000, true, 0, 0, 28*day + 14*time.Hour}, // renewed Feb 29 00:00
		{utc(2, 28, 23), 1, false, 0, time.Hour, time.Hour},
		{utc(2, 29, 0), 600, true, 400, 0, 31 * day}, // renewed Mar 31
		{utc(3, 30, 12), 500, false, 400, 12 * time.Hour, 12 * time.Hour},
		{utc(3, 31, 0), 1000, true, 0, 0, 30 * day}, // renewed Apr 30
		{utc(4, 30, 0), 1, true, 999, 0, 31 * day},  // renewed May 31
	})

	// The same limiter for a customer who subscribed on January 17 at
	// 14:23:05 in Berlin (a per-key anchor): renewed on the 17th at 14:23:05
	// Berlin time, whatever the season.
	sub := time.Date(2026, 1, 17, 14, 23, 5, 0, berlin)
	p := examplePolicy(1000, 1000, cal{Every: Month, Location: berlin, Anchor: monthEnd.Anchor}, sub)
	runExample(t, p, []exampleCheck{
		{sub, 1000, true, 0, 0, 31 * day},
		{time.Date(2026, 3, 17, 14, 23, 4, 0, berlin), 1, true, 999, 0, time.Second},         // renewed Feb 17
		{time.Date(2026, 3, 17, 14, 23, 5, 0, berlin), 1000, true, 0, 0, 31*day - time.Hour}, // Mar 29 lasts 23 hours
		{time.Date(2026, 4, 17, 14, 23, 4, 0, berlin), 1, false, 0, time.Second, time.Second},
		{time.Date(2026, 4, 17, 14, 23, 5, 0, berlin), 1, true, 999, 0, 30 * day},
	})
}

// README: a daily quota in Europe/Berlin renews at midnight, Berlin time;
// 2026-03-29 lasts 23 hours, 2026-10-25 lasts 25.
func TestCalendarExampleDSTDay(t *testing.T) {
	at := func(m time.Month, d, h, min int) time.Time { return time.Date(2026, m, d, h, min, 0, 0, berlin) }
	p := examplePolicy(100, 100, cal{Every: Day, Location: berlin}, time.Time{})
	runExample(t, p, []exampleCheck{
		{at(3, 28, 22, 0), 100, true, 0, 0, 2 * time.Hour},
		{at(3, 29, 0, 0), 100, true, 0, 0, 23 * time.Hour},
		{at(3, 29, 23, 30), 1, false, 0, 30 * time.Minute, 30 * time.Minute},
		{at(10, 25, 0, 0), 100, true, 0, 0, 25 * time.Hour},
		{at(10, 25, 23, 0), 1, false, 0, time.Hour, time.Hour},
		{at(10, 26, 0, 0), 1, true, 99, 0, 24 * time.Hour},
	})
}

// README: a rollover quota, 1000 credits a month on the 1st of which up to
// 1500 are kept: unused credits roll over, up to 500 of them.
func TestCalendarExampleRollover(t *testing.T) {
	day := 24 * time.Hour
	at := func(m time.Month, d int) time.Time { return time.Date(2026, m, d, 0, 0, 0, 0, time.UTC) }
	p := examplePolicy(1500, 1000, cal{Every: Month}, time.Time{})
	runExample(t, p, []exampleCheck{
		{at(1, 10), 1200, true, 300, 0, 50 * day},          // full again after two renewals: Mar 1
		{at(2, 1), 100, true, 1200, 0, 28 * day},           // 300 + 1000 on Feb 1
		{at(3, 1), 1500, true, 0, 0, 61 * day},             // 1200 + 1000, capped at 1500
		{at(4, 15), 1200, false, 1000, 16 * day, 16 * day}, // 1000 on Apr 1; 1500 on May 1
		{at(4, 15), 1000, true, 0, 0, 47 * day},
	})
}

// README and issue 18: the fixed grid keeps its phase (multiples of Interval
// since the Unix epoch) when the row expires and is deleted: a check every
// 9.9s against 1 per 10s, from a whole multiple of 10s, is denied only once
// (the second check: the first refill has not come yet); with a Capacity of
// 2 or 3, never.
func TestScheduleExampleGridKeepsPhase(t *testing.T) {
	if t0.UnixNano()%int64(10*time.Second) != 0 {
		t.Fatal("t0 is not on the grid")
	}
	for _, c := range []struct {
		capacity, allowed int
		denied            []int
	}{{1, 99, []int{1}}, {2, 100, nil}, {3, 100, nil}} {
		for _, cleanup := range []bool{false, true} {
			p := gridPolicy(int64(c.capacity), 1, 10*time.Second)
			st := &store{cleanup: cleanup}
			deletes := 0
			var denied []int
			for i := range 100 {
				now := t0.Add(time.Duration(i) * 9900 * time.Millisecond)
				if st.row != nil && !now.Before(st.row.ExpiresAt) {
					deletes++
				}
				if _, r := st.check(p, now, 1); !r.Allowed {
					denied = append(denied, i)
				}
			}
			if len(denied) != 100-c.allowed || fmt.Sprint(denied) != fmt.Sprint(c.denied) {
				t.Errorf("capacity %d, cleanup %v: denied %v, want %v", c.capacity, cleanup, denied, c.denied)
			}
			if cleanup && c.capacity == 1 && deletes < 10 {
				t.Errorf("capacity %d: the row expired only %d times", c.capacity, deletes)
			}
		}
	}
}

// fuzzTime maps fuzz input to a time from before year 1 to after MaxTime,
// often the zero time, MaxTime or close to them.
func fuzzTime(sec int64, nsec uint32) time.Time {
	ns := int64(nsec % 1e9)
	switch uint64(sec) % 8 {
	case 0:
		return time.Time{}.Add(time.Duration(ns))
	case 1:
		return MaxTime.Add(-time.Duration(ns))
	case 2:
		return MaxTime.Add(time.Duration(ns) * 1000)
	case 3:
		return time.Time{}.Add(-time.Duration(ns) * 1000)
	}
	lo, hi := time.Time{}.Unix()-1e9, MaxTime.Unix()+1e9
	return time.Unix(lo+int64(uint64(sec)%uint64(hi-lo)), ns).In(testZones[uint64(sec)%uint64(len(testZones))])
}

// FuzzSchedule checks grids (of any Interval, to 2^63-1ns) and calendars
// (any period, zone and anchor) at any time for panics and overflow, and
// for the invariants: floor(t) <= t < add(floor(t), 1), floor of a
// boundary is itself, count(b, add(b, n)) == n for boundaries b, count and
// add agree with floor, and all of them are monotonic.
func FuzzSchedule(f *testing.F) {
	f.Add(uint8(0), int64(1), int64(10e9), int64(1e9), uint32(0), int64(2e9), uint32(5), int64(3))
	f.Add(uint8(0), int64(0), int64(1), int64(4), uint32(1), int64(5), uint32(2), int64(math.MaxInt64))
	f.Add(uint8(0), int64(0), int64(math.MaxInt64), int64(7), uint32(9), int64(6), uint32(8), int64(math.MaxInt64))
	f.Add(uint8(1), int64(7), int64(0), int64(1e9), uint32(0), int64(2e10), uint32(5), int64(40))
	f.Add(uint8(2), int64(1769000000), int64(0), int64(17), uint32(3), int64(9), uint32(7), int64(1e6))
	f.Add(uint8(3), int64(1706659200), int64(0), int64(12), uint32(3), int64(11), uint32(7), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, kind uint8, anchor, interval, t1s int64, t1ns uint32, t2s int64, t2ns uint32, n int64) {
		var s Schedule
		if k := kind % 4; k == 0 {
			s = grid{interval: time.Duration(1 + uint64(interval)%math.MaxInt64)}
		} else {
			cal := cal{Every: Period(k), Location: testZones[int(kind/4)%len(testZones)]}
			var key time.Time
			if anchor != 0 {
				key = fuzzTime(anchor, uint32(anchor))
			}
			s = cal.at(key)
		}
		t1, t2 := fuzzTime(t1s, t1ns), fuzzTime(t2s, t2ns)
		if t2.Before(t1) {
			t1, t2 = t2, t1
		}
		f1, f2 := s.Floor(t1), s.Floor(t2)
		if f1.After(t1) || f2.After(t2) || f1.After(f2) {
			t.Fatalf("floor(%v) = %v, floor(%v) = %v", t1, f1, t2, f2)
		}
		if g := s.Floor(f1); !g.Equal(f1) {
			t.Fatalf("floor(%v) = %v: not a boundary", f1, g)
		}
		if next := s.Add(f1, 1); next.Before(MaxTime) {
			if !t1.Before(next) || !s.Floor(next).Equal(next) || s.Count(f1, next) != 1 {
				t.Fatalf("floor(%v) = %v, next %v (a boundary: %v), %d between", t1, f1, next, s.Floor(next), s.Count(f1, next))
			}
		} else if !next.Equal(MaxTime) && !next.Equal(f1) {
			t.Fatalf("add(%v, 1) = %v", f1, next)
		}
		c := s.Count(f1, t2)
		if c < 0 || (c > 0) != f2.After(f1) {
			t.Fatalf("count(%v, %v) = %d, floors %v, %v", f1, t2, c, f1, f2)
		}
		if c < math.MaxInt64 {
			if a := s.Add(f1, c); a.Before(MaxTime) && !a.Equal(f2) {
				t.Fatalf("add(%v, count %d) = %v, floor(%v) = %v", f1, c, a, t2, f2)
			}
		}
		if s.Count(t2, t1) != 0 && t2.After(t1) {
			t.Fatalf("count backwards")
		}
		// The n-th boundary after f1, and the one after it.
		n = max(n, -n, 0)
		a := s.Add(f1, n)
		if a.Before(f1) || (n == 0 && !a.Equal(f1)) {
			t.Fatalf("add(%v, %d) = %v", f1, n, a)
		}
		if a.Before(MaxTime) {
			if got := s.Count(f1, a); got != n {
				t.Fatalf("count(%v, add(%d) = %v) = %d", f1, n, a, got)
			}
			if !s.Floor(a).Equal(a) {
				t.Fatalf("add(%v, %d) = %v is not a boundary", f1, n, a)
			}
			if n < math.MaxInt64 {
				if b := s.Add(f1, n+1); !b.After(a) && b.Before(MaxTime) {
					t.Fatalf("add(%v, %d) = %v, add(%d) = %v", f1, n, a, n+1, b)
				}
			}
		}
		// The bucket math on top of it, at the extremes.
		p := policy{Capacity: math.MaxInt64, Refill: 1 + max(n, -n, 0)%1000, Schedule: s}
		if d := p.untilTokens(bucket{RefilledAt: f1}, t1, 1+n%p.Capacity); d < 0 {
			t.Fatalf("untilTokens: %v", d)
		}
		if p.horizon(n) < 0 {
			t.Fatalf("horizon(%d)", n)
		}
		b := p.load(bucket{Tokens: 0, RefilledAt: f1, ExpiresAt: MaxTime}, t2)
		if b.Tokens < 0 || b.RefilledAt.Before(f1) || b.RefilledAt.After(t2) {
			t.Fatalf("load: %+v", b)
		}
	})
}

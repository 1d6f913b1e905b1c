package account

import (
	"math"
	"math/big"
	"math/bits"
	"time"
)

// Schedule says when a bucket's refills fall: an increasing sequence of
// boundaries, each of which adds Refill tokens. Its methods take any instant,
// whatever its Location. Grid and Calendar make one.
type Schedule interface {
	// Floor is the latest boundary at or before t.
	Floor(t time.Time) time.Time
	// Count is the number of boundaries in (b, t]: 0 when t is not after b,
	// saturating at MaxInt64. b is usually a boundary, but need not be.
	Count(b, t time.Time) int64
	// Add is the n-th boundary after b (n >= 0; b itself when n is 0),
	// saturating at MaxTime (or at b, if b is later still: Add never goes
	// backwards). b is usually a boundary, but need not be: the first
	// boundary after b is then the next one on the schedule.
	Add(b time.Time, n int64) time.Time
	// Longest is an upper bound of the time between two consecutive
	// boundaries (see Policy.Horizon).
	Longest() time.Duration
}

// Grid is the schedule of a fixed interval (> 0): boundaries at every whole
// multiple of interval since the Unix epoch (UTC). Since the phase is fixed,
// a bucket keeps its grid however often its row expires or is deleted.
func Grid(interval time.Duration) Schedule { return grid{interval: interval} }

// grid is Grid's schedule.
type grid struct {
	interval time.Duration // > 0
}

// rem is (t - Unix epoch) mod interval, in [0, interval), for any t (also
// those further from the epoch than a time.Duration reaches).
func (g grid) rem(t time.Time) time.Duration {
	iv := uint64(g.interval)
	s := t.Unix() % int64(iv)
	if s < 0 {
		s += int64(iv)
	}
	// s*1e9 + nsec, modulo iv: the product has 128 bits, its high word is
	// below iv since both factors are.
	hi, lo := bits.Mul64(uint64(s), uint64(time.Second)%iv)
	_, r := bits.Div64(hi, lo, iv)
	r = (r + uint64(t.Nanosecond())%iv) % iv // both below iv <= MaxInt64: no overflow
	return time.Duration(r)
}

func (g grid) Floor(t time.Time) time.Time {
	return t.Add(-g.rem(t))
}

func (g grid) Count(b, t time.Time) int64 {
	if !t.After(b) {
		return 0
	}
	fb, ft := g.Floor(b), g.Floor(t)
	if d := ft.Sub(fb); d < math.MaxInt64 {
		return int64(d / g.interval) // d is a whole number of intervals
	}
	n := nsBetween(fb, ft)
	n.Quo(n, big.NewInt(int64(g.interval)))
	if !n.IsInt64() {
		return math.MaxInt64
	}
	return n.Int64()
}

func (g grid) Add(b time.Time, n int64) time.Time {
	if n <= 0 || !b.Before(MaxTime) {
		return b
	}
	fb := g.Floor(b)
	if n <= math.MaxInt64/int64(g.interval) {
		return timeAddSat(fb, time.Duration(n)*g.interval)
	}
	// More than a time.Duration past fb: MaxTime, unless fb is so long
	// before it that n intervals still fit.
	d := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(g.interval)))
	if d.Cmp(nsBetween(fb, MaxTime)) >= 0 {
		return MaxTime
	}
	sec, ns := new(big.Int).QuoRem(d, big.NewInt(int64(time.Second)), new(big.Int))
	return time.Unix(fb.Unix()+sec.Int64(), int64(fb.Nanosecond())+ns.Int64()).In(fb.Location())
}

func (g grid) Longest() time.Duration { return g.interval }

// nsBetween is t - from in nanoseconds, exactly.
func nsBetween(from, t time.Time) *big.Int {
	n := new(big.Int).Mul(big.NewInt(t.Unix()-from.Unix()), big.NewInt(int64(time.Second)))
	return n.Add(n, big.NewInt(int64(t.Nanosecond()-from.Nanosecond())))
}

// Period is the length of a calendar period.
type Period int

// The periods of a Calendar.
const (
	Day Period = iota + 1
	Week
	Month
)

// Calendar is the schedule of calendar periods in loc (nil: UTC), on the
// anchor's time of day, weekday (Week) or day of the month (Month), read in
// loc to the microsecond; the zero anchor is midnight, Mondays, the 1st.
// A day past a month's end falls on that month's last day. every must be
// Day, Week or Month.
func Calendar(every Period, loc *time.Location, anchor time.Time) Schedule {
	cal := calendar{every: every, loc: loc, day: 1}
	if cal.loc == nil {
		cal.loc = time.UTC
	}
	if !anchor.IsZero() {
		a := anchor.In(cal.loc)
		cal.day = a.Day()
		cal.weekday = (int(a.Weekday()) + 6) % 7
		cal.hour, cal.min, cal.sec = a.Clock()
		cal.nsec = a.Nanosecond() / 1000 * 1000
	}
	return cal
}

// calendar is Calendar's schedule.
// Its boundaries are numbered: boundary k is the k-th period's since the
// Unix epoch (day k after 1970-01-01; week k after the week of Monday
// 1970-01-05; month k after January of year 0), made with time.Date in loc.
type calendar struct {
	every                Period
	loc                  *time.Location
	day                  int // of the month, 1-31 (Month)
	weekday              int // days after Monday, 0-6 (Week)
	hour, min, sec, nsec int // the time of day
}

// maxSteps bounds the searches from a guessed boundary number to the right
// one: real zones need one or two steps (a UTC offset is less than a day).
const maxSteps = 64

// limit is a boundary number whose boundary is later than MaxTime in any
// zone: beyond it, add saturates without asking time.Date.
func (c calendar) limit() int64 {
	switch c.every {
	case Day:
		return 2932897 + 2 // 10000-01-01 is day 2932897
	case Week:
		return 2932897/7 + 2
	}
	return 10001 * 12
}

// raw is boundary k as time.Date makes it (see boundary).
func (c calendar) raw(k int64) time.Time {
	switch c.every {
	case Day:
		return time.Date(1970, 1, 1+int(k), c.hour, c.min, c.sec, c.nsec, c.loc)
	case Week:
		return time.Date(1970, 1, 5+c.weekday+7*int(k), c.hour, c.min, c.sec, c.nsec, c.loc)
	}
	y, m := floorDiv(k, 12), k-12*floorDiv(k, 12)
	return time.Date(int(y), time.Month(m+1), min(c.day, daysIn(y, time.Month(m+1))), c.hour, c.min, c.sec, c.nsec, c.loc)
}

// boundary is boundary k: raw(k), or a nanosecond after raw(k-1) when a
// zone skips day k entirely (a UTC offset moving forward by a whole day, as
// in Pacific/Apia on 30 December 2011) so that time.Date gives both the same
// instant. Weeks and months are too long for that.
func (c calendar) boundary(k int64) time.Time {
	b := c.raw(k)
	if c.every == Day {
		if prev := c.raw(k - 1); !b.After(prev) {
			return prev.Add(1)
		}
	}
	return b
}

// guess is the number of a boundary close to t: the period of t's date in
// loc.
func (c calendar) guess(t time.Time) int64 {
	y, m, d := t.In(c.loc).Date()
	day := floorDiv(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix(), 24*60*60)
	switch c.every {
	case Day:
		return day
	case Week:
		return floorDiv(day-4-int64(c.weekday), 7) // day 4 is Monday 1970-01-05
	}
	return int64(y)*12 + int64(m) - 1
}

// index is the number of the latest boundary at or before t, and that
// boundary.
func (c calendar) index(t time.Time) (int64, time.Time) {
	k := c.guess(t)
	b := c.boundary(k)
	for i := 0; i < maxSteps && b.After(t); i++ {
		k--
		b = c.boundary(k)
	}
	for range maxSteps {
		next := c.boundary(k + 1)
		if next.After(t) {
			break
		}
		k, b = k+1, next
	}
	return k, b
}

func (c calendar) Floor(t time.Time) time.Time {
	_, b := c.index(t)
	return b
}

func (c calendar) Count(b, t time.Time) int64 {
	if !t.After(b) {
		return 0
	}
	kb, _ := c.index(b)
	kt, _ := c.index(t)
	return max(AddSat(kt, -kb), 0)
}

func (c calendar) Add(b time.Time, n int64) time.Time {
	if n <= 0 || !b.Before(MaxTime) {
		return b
	}
	kb, _ := c.index(b)
	if kb > c.limit()-n {
		return MaxTime
	}
	if next := c.boundary(kb + n); next.Before(MaxTime) {
		return next
	}
	return MaxTime
}

// longest is a period's longest span in the zones in use: 25 hours for a
// day, a week and an hour, 31 days and an hour.
func (c calendar) Longest() time.Duration {
	switch c.every {
	case Day:
		return 25 * time.Hour
	case Week:
		return 7*24*time.Hour + time.Hour
	}
	return 31*24*time.Hour + time.Hour
}

// floorDiv is a/b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// daysIn is the number of days of month m of year y (proleptic Gregorian).
func daysIn(y int64, m time.Month) int {
	switch m {
	case time.February:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}

package pgratelimit

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"time"
)

// Period is the length of a calendar period: see Calendar.
type Period int

const (
	// Day is a calendar day: boundaries at one time of day, every day. A day
	// across a DST change lasts 23 or 25 hours (23.5 or 24.5 in
	// Australia/Lord_Howe).
	Day Period = iota + 1
	// Week is a calendar week: boundaries on one weekday, at one time of day.
	Week
	// Month is a calendar month: boundaries on one day of the month, at one
	// time of day. A day past a month's end falls on that month's last day.
	Month
)

// String returns "day", "week" or "month".
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return fmt.Sprintf("Period(%d)", int(p))
}

// Calendar makes a bucket's refills fall on calendar boundaries in a time
// zone instead of every Interval: every day at a time of day, every week on a
// weekday, every month on a day of the month. At each boundary the bucket
// gains Refill tokens, capped at Capacity: a Refill equal to Capacity resets
// the quota ("1000 calls a month, renewed on the 1st"), a smaller one lets
// unused tokens roll over up to Capacity.
//
// Boundaries are wall-clock times in Location, made as time.Date makes them:
// a day across a DST change lasts 23 or 25 hours, a month as long as the
// month. A boundary whose wall time does not exist on its day (inside a
// spring-forward gap) falls where time.Date puts that wall time, the gap's
// length early or late; one whose wall time occurs twice (fall-back) falls at
// one of the two. Boundaries are strictly increasing even so: a day that a
// zone skips entirely (Pacific/Apia's 30 December 2011) still has its
// boundary, a nanosecond after the previous day's.
//
// A key's bucket starts full, its refills falling on the calendar from the
// start: a first check on the 20th of a monthly quota is refilled on the 1st
// of the next month, not a month later. The calendar's phase is a property of
// the limiter (or of the key, see Anchor), never of the bucket's row, so it
// survives the row's expiry and cleanup.
//
// Location comes from time.LoadLocation, which reads the system's time zone
// database. A service that runs on a minimal image without
// /usr/share/zoneinfo must either import _ "time/tzdata" in its main package
// (which embeds the database, about 450 KB) or point the ZONEINFO
// environment variable at a zoneinfo directory or uncompressed zip file
// (such as Go's $GOROOT/lib/time/zoneinfo.zip).
type Calendar struct {
	// Every is the period: Day, Week or Month. Required.
	Every Period

	// Location is the time zone whose wall-clock times the boundaries are.
	// Defaults to UTC.
	Location *time.Location

	// Anchor fixes the boundaries' phase, read in Location to the
	// microsecond (PostgreSQL's resolution): for Day its time of day, for
	// Week its weekday and time of day, for Month its day of the month and
	// time of day. A day past a month's end falls on that month's last day
	// and the next month goes back to the anchor's day: anchored on the
	// 31st, boundaries fall on Jan 31, Feb 28 (29 in a leap year), Mar 31,
	// Apr 30. Only the anchor's wall clock and date in Location matter, not
	// its year or month: build it with time.Date in Location. A per-key
	// anchor given with a check (the customer's subscription start)
	// replaces it for that key.
	//
	// Defaults to midnight, on Mondays (Week), on the 1st (Month).
	Anchor time.Time
}

// validate checks c; its error names the field and is wrapped by the caller
// with ErrInvalidConfig.
func (c Calendar) validate() error {
	switch c.Every {
	case Day, Week, Month:
		return nil
	}
	return errors.New("Calendar.Every must be Day, Week or Month")
}

// Next returns the first boundary of c after t: when the period that holds t
// ends. c must be valid (as Config accepts it).
func (c Calendar) Next(t time.Time) time.Time {
	s := c.at(time.Time{})
	return s.add(s.floor(t), 1)
}

// at is c's schedule for a key whose own anchor is anchor: anchor replaces
// c.Anchor when it is not the zero time, and is read in c.Location like it.
// c must be valid.
func (c Calendar) at(anchor time.Time) schedule {
	cal := calendar{every: c.Every, loc: c.Location, day: 1}
	if cal.loc == nil {
		cal.loc = time.UTC
	}
	if anchor.IsZero() {
		anchor = c.Anchor
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

// schedule says when a bucket's refills fall: an increasing sequence of
// boundaries, each of which adds Refill tokens. Its methods take any instant,
// whatever its Location.
type schedule interface {
	// floor is the latest boundary at or before t.
	floor(t time.Time) time.Time
	// count is the number of boundaries in (b, t]: 0 when t is not after b,
	// saturating at MaxInt64. b is usually a boundary, but need not be.
	count(b, t time.Time) int64
	// add is the n-th boundary after b (n >= 0; b itself when n is 0),
	// saturating at maxTime (or at b, if b is later still: add never goes
	// backwards). b is usually a boundary, but need not be: the first
	// boundary after b is then the next one on the schedule.
	add(b time.Time, n int64) time.Time
	// longest is an upper bound of the time between two consecutive
	// boundaries (see policy.horizon).
	longest() time.Duration
}

// unixEpoch is the phase of every grid.
var unixEpoch = time.Unix(0, 0).UTC()

// grid is the schedule of a fixed Interval: boundaries at every whole
// multiple of interval since the Unix epoch (UTC). Since the phase is fixed,
// a bucket keeps its grid however often its row expires or is deleted.
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

func (g grid) floor(t time.Time) time.Time {
	return t.Add(-g.rem(t))
}

func (g grid) count(b, t time.Time) int64 {
	if !t.After(b) {
		return 0
	}
	fb, ft := g.floor(b), g.floor(t)
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

func (g grid) add(b time.Time, n int64) time.Time {
	if n <= 0 || !b.Before(maxTime) {
		return b
	}
	fb := g.floor(b)
	if n <= math.MaxInt64/int64(g.interval) {
		return timeAddSat(fb, time.Duration(n)*g.interval)
	}
	// More than a time.Duration past fb: maxTime, unless fb is so long
	// before it that n intervals still fit.
	d := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(g.interval)))
	if d.Cmp(nsBetween(fb, maxTime)) >= 0 {
		return maxTime
	}
	sec, ns := new(big.Int).QuoRem(d, big.NewInt(int64(time.Second)), new(big.Int))
	return time.Unix(fb.Unix()+sec.Int64(), int64(fb.Nanosecond())+ns.Int64()).In(fb.Location())
}

func (g grid) longest() time.Duration { return g.interval }

// nsBetween is t - from in nanoseconds, exactly.
func nsBetween(from, t time.Time) *big.Int {
	n := new(big.Int).Mul(big.NewInt(t.Unix()-from.Unix()), big.NewInt(int64(time.Second)))
	return n.Add(n, big.NewInt(int64(t.Nanosecond()-from.Nanosecond())))
}

// calendar is the schedule of a valid Calendar with its anchor resolved.
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

// limit is a boundary number whose boundary is later than maxTime in any
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

func (c calendar) floor(t time.Time) time.Time {
	_, b := c.index(t)
	return b
}

func (c calendar) count(b, t time.Time) int64 {
	if !t.After(b) {
		return 0
	}
	kb, _ := c.index(b)
	kt, _ := c.index(t)
	return max(addSat(kt, -kb), 0)
}

func (c calendar) add(b time.Time, n int64) time.Time {
	if n <= 0 || !b.Before(maxTime) {
		return b
	}
	kb, _ := c.index(b)
	if kb > c.limit()-n {
		return maxTime
	}
	if next := c.boundary(kb + n); next.Before(maxTime) {
		return next
	}
	return maxTime
}

// longest is a period's longest span in the zones in use: 25 hours for a
// day, a week and an hour, 31 days and an hour.
func (c calendar) longest() time.Duration {
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

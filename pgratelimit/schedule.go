package pgratelimit

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/alert"
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

// at is c's schedule for a key whose own anchor is anchor: anchor replaces
// c.Anchor when it is not the zero time, and is read in c.Location like it.
// c must be valid.
func (c Calendar) at(anchor time.Time) account.Schedule {
	if anchor.IsZero() {
		anchor = c.Anchor
	}
	return account.Calendar(account.Period(c.Every), c.Location, anchor)
}

// Window is how long an empty bucket of l takes to fill, as of the check
// that gave r: ceil(Capacity/Refill) intervals (saturating at the longest
// time.Duration); with a Calendar, from the check's time to the boundary
// that fills an empty bucket (the rest of the period when Refill is
// Capacity). It is the window (w) of the RateLimit-Policy field that the
// middleware of this repository sends, so that w and the t of RateLimit
// (r.ResetAfter) agree.
func (l *Limiter) Window(r Result) time.Duration {
	return window(l.cfg, r, l.localNow())
}

// maxWindowPeriods bounds the calendar periods a window counts.
const maxWindowPeriods = 1200

// window is Window at now, the application's clock. The check's time is
// the database's clock (or Config.Clock), which the application does not
// see: a bucket that is not full is full again on a boundary, so the
// check's time is that boundary (the one nearest to now + r.ResetAfter)
// less r.ResetAfter. For a full bucket, now is taken as it is.
func window(cfg Config, r Result, now time.Time) time.Duration {
	if cfg.Calendar == (Calendar{}) {
		return alert.Window(cfg.Capacity, cfg.Refill, cfg.Interval)
	}
	refills := cfg.Capacity / cfg.Refill
	if cfg.Capacity%cfg.Refill != 0 {
		refills++
	}
	s := cfg.Calendar.at(time.Time{})
	if r.Remaining < r.Limit && r.ResetAfter > 0 {
		full := now.Add(r.ResetAfter)
		b := s.Floor(full)
		if next := s.Add(b, 1); next.Sub(full) < full.Sub(b) {
			b = next
		}
		now = b.Add(-r.ResetAfter)
	}
	return s.Add(s.Floor(now), min(refills, maxWindowPeriods)).Sub(now)
}

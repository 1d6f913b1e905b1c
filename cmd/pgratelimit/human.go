package main

import (
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/humantime"
)

// day is the largest unit human uses.
const day = humantime.Day

// human formats a wait for people: humantime.Duration, which the demo's
// page shares ("412ms", "4.307s", "20s", "12m 5s", "3h 12m", "5d 14h").
func human(d time.Duration) string { return humantime.Duration(d) }

// momentLayout is how a moment is shown: to the minute, in the local time
// zone, with its name.
const momentLayout = "2006-01-02 15:04 MST"

// whenIn says when something happens, d after now: "in 20s", and from a day up
// the moment too, in now's time zone, rounded up to the minute like the
// wait: "in 5d 14h (2026-12-01 03:12 UTC)".
func whenIn(d time.Duration, now time.Time) string {
	s := "in " + human(d)
	if d < day {
		return s
	}
	t := now.Add(d)
	if r := t.Sub(t.Truncate(time.Minute)); r != 0 {
		t = t.Add(time.Minute - r)
	}
	return s + " (" + t.Format(momentLayout) + ")"
}

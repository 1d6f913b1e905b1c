// Package human says durations, moments, counts and fractions for people,
// the same way in the CLI's output, the load bench's report and the demo's
// page and messages.
package human

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Day is the largest unit Duration uses.
const Day = 24 * time.Hour

// Duration formats a wait for people, never shorter than the truth (rounded
// up): under a minute as Go prints it, to the millisecond below 10s and to
// the second from there ("412ms", "4.307s", "20s"); from a minute up in its
// two largest units of days, hours, minutes and seconds, rounded up to the
// second of them ("12m 5s", "3h 12m", "5d 14h"; "2h" when the second is 0).
// The demo's page (web/app.js, fmtMs) says waits the same way.
func Duration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	var unit time.Duration
	switch {
	case d < 10*time.Second:
		unit = time.Millisecond
	case d < time.Hour:
		unit = time.Second
	case d < Day:
		unit = time.Minute
	default:
		unit = time.Hour
	}
	if r := d % unit; r != 0 && d <= math.MaxInt64-unit {
		d += unit - r
	}
	if d < time.Minute {
		return d.String()
	}
	units := []struct {
		size time.Duration
		name string
	}{{Day, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}}
	for i, u := range units {
		if d < u.size {
			continue
		}
		s := fmt.Sprintf("%d%s", d/u.size, u.name)
		if i+1 < len(units) {
			if n := d % u.size / units[i+1].size; n != 0 {
				s += fmt.Sprintf(" %d%s", n, units[i+1].name)
			}
		}
		return s
	}
	return d.String() // not reached: d is a minute or more
}

// momentLayout is how In shows a moment: to the minute, in the local time
// zone, with its name.
const momentLayout = "2006-01-02 15:04 MST"

// In says when something happens, d after now: "in 20s", and from a day up
// the moment too, in now's time zone, rounded up to the minute like the
// wait: "in 5d 14h (2026-12-01 03:12 UTC)".
func In(d time.Duration, now time.Time) string {
	s := "in " + Duration(d)
	if d < Day {
		return s
	}
	t := now.Add(d)
	if r := t.Sub(t.Truncate(time.Minute)); r != 0 {
		t = t.Add(time.Minute - r)
	}
	return s + " (" + t.Format(momentLayout) + ")"
}

// Plural says n things: "1 token", "3 tokens".
func Plural(n int64, one, many string) string {
	if n == 1 || n == -1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// Percent says a fraction as a percentage, rounded to a millionth of a
// percent (0.57*100 is 56.99999999999999): "57%".
func Percent(fraction float64) string {
	return strconv.FormatFloat(math.Round(fraction*1e8)/1e6, 'f', -1, 64) + "%"
}

package sqlgen

import (
	"testing"
	"time"
)

func TestTextArrays(t *testing.T) {
	got := TextArray(3, func(i int) string { return []string{`a"b`, `c\d`, `é,{}`}[i] })
	if want := `{"a\"b","c\\d","é,{}"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestTimeArrays(t *testing.T) {
	a := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	b := time.Date(2026, 11, 22, 9, 0, 0, 123456000, time.UTC) // a, in UTC and microseconds
	c := b.Add(time.Minute)
	got := TimeArray(5, func(i int) time.Time { return []time.Time{a, b, c, c, a}[i] })
	if want := `{"2026-11-22 09:00:00.123456Z","2026-11-22 09:00:00.123456Z","2026-11-22 09:01:00.123456Z","2026-11-22 09:01:00.123456Z","2026-11-22 09:00:00.123456Z"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestIntervalInput(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0 hours 0.000000 seconds",
		1500 * time.Microsecond: "0 hours 0.001500 seconds",
		time.Hour + 2*time.Second + time.Microsecond: "1 hours 2.000001 seconds",
		time.Duration(1<<63 - 1):                     "2562047 hours 2836.854775 seconds",
	} {
		if got := Interval(d); got != want {
			t.Errorf("interval(%s) = %q, want %q", d, got, want)
		}
	}
}

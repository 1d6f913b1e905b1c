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

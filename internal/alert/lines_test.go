package alert

import (
	"math"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

func TestValidate(t *testing.T) {
	ok := []Thresholds{
		{},
		{Used: []float64{0.8, 0.9, 1}, Below: []int64{0, 100}, Exhausted: true},
		{Used: []float64{math.SmallestNonzeroFloat64}},
	}
	for _, th := range ok {
		if err := th.Validate(); err != nil {
			t.Errorf("%+v: %v", th, err)
		}
	}
	many := Thresholds{Exhausted: true}
	for i := range 63 {
		many.Below = append(many.Below, int64(i))
	}
	bad := []Thresholds{
		{Used: []float64{0}},
		{Used: []float64{1.01}},
		{Used: []float64{-0.5}},
		{Used: []float64{math.NaN()}},
		{Used: []float64{math.Inf(1)}},
		{Used: []float64{0.8, 0.8}},
		{Below: []int64{-1}},
		{Below: []int64{5, 5}},
		many,
	}
	for _, th := range bad {
		if err := th.Validate(); err == nil {
			t.Errorf("%+v: no error", th)
		}
	}
}

func TestCompile(t *testing.T) {
	s := Compile(Thresholds{Used: []float64{1, 0.8}, Below: []int64{0, 100}, Exhausted: true}, 1000)
	want := []string{"used:0.8", "used:1", "below:100", "below:0", "exhausted"}
	if len(s.Lines) != len(want) {
		t.Fatalf("lines %v", s.Lines)
	}
	for i, l := range s.Lines {
		if l.Label() != want[i] {
			t.Errorf("line %d: %s, want %s", i, l.Label(), want[i])
		}
	}
	if s.Denied() != 1<<4 {
		t.Errorf("Denied %b", s.Denied())
	}
	if Compile(Thresholds{Used: []float64{0.5}}, 10).Denied() != 0 {
		t.Error("Denied without Exhausted")
	}
}

func TestUsedAt(t *testing.T) {
	for _, c := range []struct {
		f    float64
		capa int64
		want int64
	}{
		{0.8, 1000, 800},
		{0.5, 3, 2},
		{1, 7, 7},
		{0.1, 3, 1},
		{0.3, 10, 3}, // the decimals, not the float64s near them
		{0.7, 10, 7},
		{0.1, 10, 1},
		{0.95, 100, 95},
		{0.333, 1000, 333},
		{0.3333, 1000, 334},
		{1, math.MaxInt64, math.MaxInt64},
		{0.5, math.MaxInt64, 1 << 62},
		{math.SmallestNonzeroFloat64, math.MaxInt64, 1},
	} {
		if got := usedAt(c.f, c.capa); got != c.want {
			t.Errorf("usedAt(%v, %d) = %d, want %d", c.f, c.capa, got, c.want)
		}
	}
}

func TestCrossed(t *testing.T) {
	s := Compile(Thresholds{Used: []float64{0.5, 0.8, 1}, Below: []int64{100, 0}}, 1000)
	bits := func(labels ...string) uint64 { return s.Mask(labels) }
	for _, c := range []struct {
		before, after Balance
		want          uint64
	}{
		{Balance{1000, 0}, Balance{900, 0}, 0},
		{Balance{1000, 0}, Balance{500, 0}, bits("used:0.5")},
		{Balance{501, 0}, Balance{200, 0}, bits("used:0.5", "used:0.8")},
		{Balance{200, 0}, Balance{100, 0}, bits("below:100")},
		{Balance{101, 50}, Balance{0, 50}, bits("used:1", "below:100")},
		{Balance{10, 91}, Balance{0, 100}, bits("used:1", "below:100")}, // a refund to the grants? the bucket still fell
		{Balance{0, 5}, Balance{-3, 0}, bits("below:0")},
		{Balance{-3, 0}, Balance{-10, 0}, 0},
		{Balance{200, 0}, Balance{900, 0}, 0},
		{Balance{math.MinInt64, 0}, Balance{math.MinInt64, 0}, 0},
		{Balance{math.MaxInt64, math.MaxInt64}, Balance{math.MinInt64, 0}, bits("used:0.5", "used:0.8", "used:1", "below:100", "below:0")},
	} {
		if got := s.Crossed(c.before, c.after); got != c.want {
			t.Errorf("%+v -> %+v: %b, want %b", c.before, c.after, got, c.want)
		}
	}
}

func TestWindow(t *testing.T) {
	for _, c := range []struct {
		capa, refill int64
		iv, want     time.Duration
	}{
		{10, 3, time.Minute, 4 * time.Minute},
		{10, 10, time.Minute, time.Minute},
		{10, 100, time.Minute, time.Minute},
		{math.MaxInt64, 1, time.Second, math.MaxInt64},
		{1 << 40, 1, 1 << 23, math.MaxInt64}, // 2^63 ns: one past the longest Duration
		{1 << 40, 1, 1<<23 - 1, (1<<23 - 1) << 40},
	} {
		if got := Window(c.capa, c.refill, c.iv); got != c.want {
			t.Errorf("Window(%d, %d, %s) = %s, want %s", c.capa, c.refill, c.iv, got, c.want)
		}
	}
}

func TestPeriod(t *testing.T) {
	at := time.Date(2026, 3, 29, 12, 30, 0, 0, time.UTC)
	start, end := Period(nil, 4*time.Minute, at)
	if !start.Equal(time.Date(2026, 3, 29, 12, 28, 0, 0, time.UTC)) || end.Sub(start) != 4*time.Minute {
		t.Errorf("grid: %s %s", start, end)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	day := account.Calendar(account.Day, berlin, time.Time{})
	start, end = Period(day, 0, at)
	if !start.Equal(time.Date(2026, 3, 29, 0, 0, 0, 0, berlin)) || end.Sub(start) != 23*time.Hour {
		t.Errorf("a day that lasts 23 hours: %s %s", start, end)
	}
	month := account.Calendar(account.Month, nil, time.Date(2025, 1, 31, 9, 0, 0, 0, time.UTC))
	start, end = Period(month, 0, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	if !start.Equal(time.Date(2026, 2, 28, 9, 0, 0, 0, time.UTC)) || !end.Equal(time.Date(2026, 3, 31, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("anchored on the 31st: %s %s", start, end)
	}
	start, end = Period(nil, math.MaxInt64, account.MaxTime.Add(-time.Hour))
	if start.After(account.MaxTime) || !end.Equal(account.MaxTime) {
		t.Errorf("saturating: %s %s", start, end)
	}
}

func TestMemory(t *testing.T) {
	var m Memory
	at := time.Unix(1000, 0)
	if m.Known("p", "k", at) != 0 {
		t.Fatal("empty memory knows")
	}
	m.Learn("p", "k", at, 0b101)
	m.Learn("p", "k", at, 0b010)
	if got := m.Known("p", "k", at); got != 0b111 {
		t.Errorf("known %b", got)
	}
	if m.Known("p", "k", at.Add(time.Second)) != 0 || m.Known("p", "j", at) != 0 {
		t.Error("another period or key known")
	}
	for i := range 3 * memorySize {
		m.Learn("p", "k", at.Add(time.Duration(i+1)*time.Second), 1)
	}
	if n := len(m.known); n > memorySize {
		t.Errorf("%d entries, bound %d", n, memorySize)
	}
}

package alert

import (
	"encoding/binary"
	"math/big"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// fuzzInput reads numbers from fuzz data, zero once it runs out.
type fuzzInput struct{ b []byte }

func (in *fuzzInput) u64() uint64 {
	var x [8]byte
	n := copy(x[:], in.b)
	in.b = in.b[n:]
	return binary.LittleEndian.Uint64(x[:])
}

// in returns a number in [lo, hi].
func (in *fuzzInput) in(lo, hi int64) int64 {
	return lo + int64(in.u64()%uint64(hi-lo+1))
}

// thresholds draws lines for a bucket of capacity.
func (in *fuzzInput) thresholds(capacity int64) Thresholds {
	var t Thresholds
	for range in.in(0, 5) {
		// Decimals with up to four digits, as configurations write them.
		f := float64(in.in(1, 10000)) / 10000
		if !slices.Contains(t.Used, f) {
			t.Used = append(t.Used, f)
		}
	}
	for range in.in(0, 4) {
		l := in.in(0, capacity*2)
		if !slices.Contains(t.Below, l) {
			t.Below = append(t.Below, l)
		}
	}
	t.Exhausted = in.in(0, 1) == 1
	return t
}

// crossedByDefinition says whether a change of balance from before to after
// crosses l, by the definitions in exact arithmetic: the used fraction
// (capacity minus tokens, over capacity) reaches or passes l.Fraction read
// as a decimal, or the balance (tokens plus grants) goes from above
// l.Level to at or below it.
func crossedByDefinition(l Line, capacity int64, before, after Balance) bool {
	switch l.Kind {
	case Used:
		f, _ := new(big.Rat).SetString(strconv.FormatFloat(l.Fraction, 'g', -1, 64))
		line := new(big.Rat).Mul(f, new(big.Rat).SetInt64(capacity))
		ub := new(big.Rat).SetInt64(capacity - before.Tokens)
		ua := new(big.Rat).SetInt64(capacity - after.Tokens)
		return ub.Cmp(line) < 0 && ua.Cmp(line) >= 0
	case Below:
		return before.Tokens+before.Granted > l.Level && after.Tokens+after.Granted <= l.Level
	}
	return false
}

// FuzzCrossed checks Crossed against the definitions, and that a falling
// balance crosses each line at most once, whatever steps it falls by.
func FuzzCrossed(f *testing.F) {
	f.Add([]byte("\x10\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte{200, 3, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 77, 9, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzInput{b: data}
		capacity := in.in(1, 1<<40)
		th := in.thresholds(capacity)
		if err := th.Validate(); err != nil {
			t.Fatal(err)
		}
		s := Compile(th, capacity)
		bal := Balance{Tokens: in.in(-capacity, capacity), Granted: in.in(0, capacity)}
		start := bal
		var seen uint64
		for range in.in(1, 20) {
			next := Balance{Tokens: bal.Tokens - in.in(0, capacity/2+1), Granted: max(bal.Granted-in.in(0, capacity/4+1), 0)}
			got := s.Crossed(bal, next)
			for i, l := range s.Lines {
				if want := crossedByDefinition(l, capacity, bal, next); want != (got&(1<<i) != 0) {
					t.Fatalf("capacity %d, %s: %+v -> %+v: crossed %v, by definition %v", capacity, l.Label(), bal, next, !want, want)
				}
			}
			if got&seen != 0 {
				t.Fatalf("a falling balance crossed %b twice", got&seen)
			}
			seen |= got
			if up := s.Crossed(next, bal); up != 0 {
				t.Fatalf("a rising balance crossed %b", up)
			}
			bal = next
		}
		if all := s.Crossed(start, bal); all != seen {
			t.Fatalf("in one step %b, in many %b", all, seen)
		}
	})
}

// FuzzOncePerPeriod walks a key's balance up and down through time and
// fires lines as the Observer does (Crossed, less what the Memory knows,
// less what the state of the period holds, the Memory learning what the
// state holds when it is read), against a model that fires a line at the
// first crossing by definition in each period: the same lines fire at the
// same steps, each at most once per period.
func FuzzOncePerPeriod(f *testing.F) {
	f.Add([]byte{10, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{100, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzInput{b: data}
		capacity := in.in(1, 1000)
		s := Compile(in.thresholds(capacity), capacity)
		var sched account.Schedule
		window := time.Duration(in.in(0, 3)) * time.Hour
		if window == 0 {
			sched = account.Calendar(account.Day, nil, time.Time{})
		}
		var (
			mem   Memory
			state = map[time.Time][]string{} // the database's alert state
			model = map[time.Time][]string{} // the model's: lines fired per period
			now   = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			bal   = Balance{Tokens: capacity}
		)
		for range in.in(1, 60) {
			now = now.Add(time.Duration(in.in(0, 180)) * time.Minute)
			start, end := Period(sched, window, now)
			if start.After(now) || !end.After(now) {
				t.Fatalf("%s not in [%s, %s)", now, start, end)
			}
			next, denied := Balance{Tokens: bal.Tokens + in.in(-capacity, capacity/2), Granted: bal.Granted}, in.in(0, 3) == 0
			if denied {
				next = bal
			}
			// The Observer's way.
			mask := s.Crossed(bal, next)
			if denied {
				mask = s.Denied()
			}
			var fired []string
			if mask &^= mem.Known("p", "k", start); mask != 0 {
				mem.Learn("p", "k", start, s.Mask(state[start])) // the read
				s.Each(mask, func(_ int, l Line) {
					if !slices.Contains(state[start], l.Label()) {
						fired = append(fired, l.Label())
						state[start] = append(state[start], l.Label())
					}
				})
			}
			// The model's.
			var want []string
			for _, l := range s.Lines {
				hit := crossedByDefinition(l, capacity, bal, next)
				if l.Kind == Exhausted {
					hit = denied
				} else if denied {
					hit = false
				}
				if hit && !slices.Contains(model[start], l.Label()) {
					want = append(want, l.Label())
					model[start] = append(model[start], l.Label())
				}
			}
			if !slices.Equal(fired, want) {
				t.Fatalf("at %s (period %s), %+v -> %+v, denied %v: fired %v, the model %v", now, start, bal, next, denied, fired, want)
			}
			bal = next
		}
	})
}

package alert

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Kind is what an alert line watches.
type Kind int8

// The kinds of lines (and of events).
const (
	// Used: a fraction of the period's quota used (the bucket alone).
	Used Kind = iota + 1
	// Below: the balance (bucket plus live grants) at or below a level.
	Below
	// Exhausted: a charge denied because the balance did not cover it.
	Exhausted
)

// String is the events table's word for k.
func (k Kind) String() string {
	switch k {
	case Used:
		return "used"
	case Below:
		return "below"
	case Exhausted:
		return "exhausted"
	}
	return "unknown"
}

// Line is one threshold.
type Line struct {
	Kind     Kind
	Fraction float64 // Used: in (0, 1]
	Level    int64   // Below: >= 0
}

// Label names l in a key's alert state: "used:0.8", "below:100",
// "exhausted". It depends on the line alone (not on its place in a
// configuration), so limiters that share a prefix, and a configuration
// that gains a line between deploys, agree on what has fired.
func (l Line) Label() string {
	switch l.Kind {
	case Used:
		return "used:" + l.Threshold()
	case Below:
		return "below:" + l.Threshold()
	}
	return l.Kind.String()
}

// Threshold is l's fraction or level as numeric input ("" for Exhausted).
func (l Line) Threshold() string {
	switch l.Kind {
	case Used:
		return strconv.FormatFloat(l.Fraction, 'g', -1, 64)
	case Below:
		return strconv.FormatInt(l.Level, 10)
	}
	return ""
}

// MaxLines is the most lines a configuration may draw: each is a bit of a
// uint64 mask.
const MaxLines = 63

// Thresholds are the lines of a limiter as configured.
type Thresholds struct {
	Used      []float64
	Below     []int64
	Exhausted bool
}

// Empty says there are no lines.
func (t Thresholds) Empty() bool { return len(t.Used) == 0 && len(t.Below) == 0 && !t.Exhausted }

// Validate checks t: fractions in (0, 1] (NaN is not), levels >= 0, no line
// twice, at most MaxLines in all. Its error names the field (UsedFractions,
// BalanceAtOrBelow); the root package wraps it in ErrInvalidConfig.
func (t Thresholds) Validate() error {
	for _, f := range t.Used {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("UsedFractions must be in (0, 1], got %v", f)
		}
	}
	for _, l := range t.Below {
		if l < 0 {
			return fmt.Errorf("BalanceAtOrBelow levels must be >= 0, got %d", l)
		}
	}
	if hasDup(t.Used) {
		return fmt.Errorf("UsedFractions has a fraction twice: %v", t.Used)
	}
	if hasDup(t.Below) {
		return fmt.Errorf("BalanceAtOrBelow has a level twice: %v", t.Below)
	}
	n := len(t.Used) + len(t.Below)
	if t.Exhausted {
		n++
	}
	if n > MaxLines {
		return fmt.Errorf("UsedFractions, BalanceAtOrBelow and Exhausted draw %d lines, at most %d in all", n, MaxLines)
	}
	return nil
}

func hasDup[T int64 | float64](xs []T) bool {
	s := slices.Clone(xs)
	slices.Sort(s)
	return len(slices.Compact(s)) != len(xs)
}

// Spec is the lines of a limiter of one Capacity, ready to test charges
// against: bit i of a mask is Lines[i].
type Spec struct {
	Lines    []Line
	Capacity int64
	// used[i] is, for a Used line, the tokens used at the line:
	// ceil(Fraction * Capacity), exactly.
	used []int64
}

// Compile returns the spec of t (validated) for a bucket of capacity (> 0):
// Used lines in ascending order, then Below lines in descending order (the
// order a falling balance crosses them), then Exhausted.
func Compile(t Thresholds, capacity int64) *Spec {
	s := &Spec{Capacity: capacity}
	used := slices.Clone(t.Used)
	slices.Sort(used)
	for _, f := range used {
		s.Lines = append(s.Lines, Line{Kind: Used, Fraction: f})
		s.used = append(s.used, usedAt(f, capacity))
	}
	below := slices.Clone(t.Below)
	slices.Sort(below)
	slices.Reverse(below)
	for _, l := range below {
		s.Lines = append(s.Lines, Line{Kind: Below, Level: l})
		s.used = append(s.used, 0)
	}
	if t.Exhausted {
		s.Lines = append(s.Lines, Line{Kind: Exhausted})
		s.used = append(s.used, 0)
	}
	return s
}

// usedAt is ceil(f * capacity) for f in (0, 1], exactly, f read as the
// decimal it prints as (its label's): 0.8 of 1000 is 800, although the
// float64 nearest 0.8 is a little more than 4/5.
func usedAt(f float64, capacity int64) int64 {
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if !ok {
		r = new(big.Rat).SetFloat64(f) // cannot happen: a finite float prints as a decimal
	}
	r.Mul(r, new(big.Rat).SetInt64(capacity))
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64() // in [1, capacity]
}

// Balance is what a key holds: its bucket's tokens (negative: a debt) and
// the credits of its live grants.
type Balance struct {
	Tokens, Granted int64
}

// Of is the balance an outcome reports.
func Of(o account.Outcome) Balance { return Balance{Tokens: o.Remaining, Granted: o.Granted} }

// Total is tokens plus grants, saturating.
func (b Balance) Total() int64 { return account.AddSat(b.Tokens, b.Granted) }

// Used is how many of capacity's tokens the bucket has used: capacity
// minus its tokens, saturating (more than capacity while it owes).
func (b Balance) Used(capacity int64) int64 {
	return account.AddSat(capacity, -max(b.Tokens, -math.MaxInt64))
}

// Crossed returns the mask of the Used and Below lines that a change of
// balance from before to after crosses: a Used line when the tokens used
// were below it and are now at or above it; a Below line when the balance
// was above its level and is now at or below it. A change that raises the
// balance crosses none.
func (s *Spec) Crossed(before, after Balance) uint64 {
	var mask uint64
	ub, ua := before.Used(s.Capacity), after.Used(s.Capacity)
	tb, ta := before.Total(), after.Total()
	for i, l := range s.Lines {
		switch l.Kind {
		case Used:
			if ub < s.used[i] && s.used[i] <= ua {
				mask |= 1 << i
			}
		case Below:
			if tb > l.Level && l.Level >= ta {
				mask |= 1 << i
			}
		}
	}
	return mask
}

// Denied returns the mask of the Exhausted line, if there is one: what a
// charge the balance did not cover fires.
func (s *Spec) Denied() uint64 {
	if n := len(s.Lines); n > 0 && s.Lines[n-1].Kind == Exhausted {
		return 1 << (n - 1)
	}
	return 0
}

// Each calls f with every line of mask, in order.
func (s *Spec) Each(mask uint64, f func(i int, l Line)) {
	for mask != 0 {
		i := bits.TrailingZeros64(mask)
		mask &^= 1 << i
		if i < len(s.Lines) {
			f(i, s.Lines[i])
		}
	}
}

// Mask is the mask of the lines of s whose labels are in labels.
func (s *Spec) Mask(labels []string) uint64 {
	var mask uint64
	for i, l := range s.Lines {
		if slices.Contains(labels, l.Label()) {
			mask |= 1 << i
		}
	}
	return mask
}

package account

import (
	"testing"
	"time"
)

// What the model costs a plain check (no grants, no request ID).
func BenchmarkApplyCharge(b *testing.B) {
	p := Policy{Capacity: 1000, Refill: 100, Schedule: Grid(time.Second)}
	s := State{Bucket: Bucket{Tokens: 1000, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour), Capacity: 1000}}
	op := Op{Kind: OpCharge, Amount: 1}
	b.ReportAllocs()
	now := t0
	for b.Loop() {
		var c Change
		s, c, _ = Apply(p, s, now, op)
		if !c.Allowed {
			b.Fatal("denied")
		}
		now = now.Add(10 * time.Millisecond)
	}
}

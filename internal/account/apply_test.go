package account

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
)

// t0 is a boundary of every grid of a whole number of seconds dividing a
// day (grids are phased at the Unix epoch).
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func gridPolicy(capacity, refill int64, interval time.Duration) Policy {
	return Policy{Capacity: capacity, Refill: refill, Schedule: Grid(interval)}
}

// ledgered is p with a ledger, remembering request IDs for retention.
func ledgered(p Policy, retention time.Duration) Policy {
	p.Ledger, p.Retention = true, retention
	return p
}

// must applies op and fails the test on an error.
func must(t *testing.T, p Policy, s State, now time.Time, op Op) (State, Change) {
	t.Helper()
	ns, c, err := Apply(p, s, now, op)
	if err != nil {
		t.Fatalf("%v: %v", op, err)
	}
	return ns, c
}

func balanceOf(p Policy, s State, now time.Time) (tokens, granted int64) {
	o := Look(p, s, now, 1)
	return o.Remaining, o.Granted
}

// The bugs of issue #31, each as it was reported.
func TestDebtIsRepaidOnce(t *testing.T) {
	p := ledgered(gridPolicy(100, 1, time.Hour), time.Hour)
	var s State
	s, _ = must(t, p, s, t0, Op{Kind: OpCharge, Amount: 10, ID: "e"})
	s, _ = must(t, p, s, t0, Op{Kind: OpDebit, Amount: 95}) // remaining -5
	s, c := must(t, p, s, t0, Op{Kind: OpGrant, Amount: 100, GrantID: 1})
	if c.Remaining != 0 || c.Granted != 95 {
		t.Fatalf("grant onto a debt of 5: %+v", c.Outcome)
	}
	for want := int64(94); want >= 93; want-- {
		var c Change
		s, c = must(t, p, s, t0, Op{Kind: OpCharge, Amount: 1})
		if c.Granted != want || c.Remaining != 0 || len(c.Entries) != 1 || c.Entries[0].Amount != -1 || c.Entries[0].Balance != want {
			t.Fatalf("charge of 1: %+v %+v", c.Outcome, c.Entries)
		}
	}
}

func TestPeekCountsTheDebtAgainstGrants(t *testing.T) {
	p := ledgered(gridPolicy(10, 1, time.Minute), time.Hour)
	var s State
	s, _ = must(t, p, s, t0, Op{Kind: OpDebit, Amount: 17})
	s, _ = must(t, p, s, t0, Op{Kind: OpGrant, Amount: 4, GrantID: 1})
	o := Look(p, s, t0, 1)
	if o.Allowed || o.Remaining != -3 || o.Granted != 0 || o.RetryAfter != 4*time.Minute {
		t.Fatalf("peek: %+v", o)
	}
	if _, c := must(t, p, s, t0, Op{Kind: OpCharge, Amount: 1}); c.Allowed || c.RetryAfter != o.RetryAfter {
		t.Fatalf("charge after peek: %+v", c.Outcome)
	}
}

// RetryAfter counts grants that expire before it out.
func TestRetryAfterCountsExpiringGrantsOut(t *testing.T) {
	p := ledgered(gridPolicy(10, 1, time.Minute), time.Hour)
	s := State{Bucket: Bucket{Tokens: 0, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour), Capacity: 10},
		Grants: []Grant{{ID: 1, Amount: 5, ExpiresAt: t0.Add(90 * time.Second)}}}
	// 7 needs 2 refills with the grant, but it expires at 1m30s: 7 refills.
	if o := Look(p, s, t0, 7); o.Allowed || o.RetryAfter != 7*time.Minute {
		t.Fatalf("%+v", o)
	}
	// 6 needs 1 refill with the grant, at 1m, before it expires.
	if o := Look(p, s, t0, 6); o.Allowed || o.RetryAfter != time.Minute {
		t.Fatalf("%+v", o)
	}
	// 16 could only be with the grant: never without it.
	if o := Look(p, s, t0, 16); o.RetryAfter != Inf {
		t.Fatalf("%+v", o)
	}
}

func TestSettleBelowTheEstimateGivesBackWhereItCameFrom(t *testing.T) {
	p := ledgered(gridPolicy(100, 100, 30*24*time.Hour), time.Hour)
	s := State{Bucket: Bucket{Tokens: 5, RefilledAt: t0, ExpiresAt: t0.Add(time.Hour), Capacity: 100}}
	s, _ = must(t, p, s, t0, Op{Kind: OpGrant, Amount: 200, GrantID: 1})
	s, c := must(t, p, s, t0, Op{Kind: OpCharge, Amount: 60, ID: "a"})
	if c.Remaining != 0 || c.Granted != 145 {
		t.Fatalf("charge: %+v", c.Outcome)
	}
	s, c = must(t, p, s, t0, Op{Kind: OpSettle, Amount: 10, ID: "a"})
	// 50 back: 55 taken from the grant, so all of it goes there.
	if c.Remaining != 0 || c.Granted != 195 || c.Entries[0].Amount != 50 || c.Entries[0].GrantsAmount != 50 {
		t.Fatalf("settle: %+v %+v", c.Outcome, c.Entries)
	}
	// Again at the same actual: the first settlement's outcome; another: a mismatch.
	if _, c2, err := Apply(p, s, t0, Op{Kind: OpSettle, Amount: 10, ID: "a"}); err != nil || !c2.Replayed || c2.Outcome != c.Outcome {
		t.Fatalf("settle again: %+v %v", c2, err)
	}
	if _, _, err := Apply(p, s, t0, Op{Kind: OpSettle, Amount: 11, ID: "a"}); !errors.Is(err, ErrRequestMismatch) {
		t.Fatalf("settle at another cost: %v", err)
	}
}

// A refund capped at Capacity writes what the balance gained.
func TestCappedSettleLedgerAddsUp(t *testing.T) {
	p := ledgered(gridPolicy(100, 1, time.Hour), 2*time.Hour)
	s, _ := must(t, p, State{}, t0, Op{Kind: OpCharge, Amount: 70, ID: "a"})
	s, _ = must(t, p, s, t0.Add(time.Hour), Op{Kind: OpRefund, Amount: 60}) // 31 + 60 -> 91
	_, c := must(t, p, s, t0.Add(time.Hour), Op{Kind: OpSettle, Amount: 10, ID: "a"})
	if c.Remaining != 100 || len(c.Entries) != 1 || c.Entries[0].Amount != 9 {
		t.Fatalf("settle: %+v %+v", c.Outcome, c.Entries)
	}
}

func TestGrantExpiryIsAnEntry(t *testing.T) {
	p := ledgered(gridPolicy(10, 1, time.Hour), time.Hour)
	s, _ := must(t, p, State{}, t0, Op{Kind: OpGrant, Amount: 21, GrantID: 1, ExpiresAt: t0.Add(time.Minute)})
	if _, _, err := Apply(p, s, t0.Add(time.Minute), Op{Kind: OpGrant, Amount: 3, GrantID: 2, ExpiresAt: t0.Add(time.Minute)}); !errors.Is(err, ErrGrantExpired) {
		t.Fatalf("grant expiring now: %v", err)
	}
	// At the expiry itself the grant is no longer live.
	_, c := must(t, p, s, t0.Add(time.Minute), Op{Kind: OpCharge, Amount: 1})
	want := []Entry{{Kind: OpExpire, Amount: -21, GrantsAmount: -21, Balance: 10}, {Kind: OpCharge, Amount: -1, Balance: 9}}
	if !reflect.DeepEqual(c.Entries, want) {
		t.Fatalf("entries %+v", c.Entries)
	}
}

func TestPlanChange(t *testing.T) {
	month := Calendar(Month, time.UTC, time.Time{})
	small, big := Policy{Capacity: 1000, Refill: 1000, Schedule: month, Ledger: true}, Policy{Capacity: 5000, Refill: 5000, Schedule: month, Ledger: true}
	s, _ := must(t, small, State{}, t0, Op{Kind: OpCharge, Amount: 900})
	s, c := must(t, big, s, t0, Op{Kind: OpCharge, Amount: 1})
	if c.Remaining != 4099 || c.Entries[0].Kind != OpPlan || c.Entries[0].Amount != 4000 {
		t.Fatalf("upgrade: %+v %+v", c.Outcome, c.Entries)
	}
	_, c = must(t, small, s, t0, Op{Kind: OpCharge, Amount: 1})
	if c.Remaining != 999 || c.Entries[0].Amount != -3099 {
		t.Fatalf("downgrade: %+v %+v", c.Outcome, c.Entries)
	}
}

func TestRequestMismatch(t *testing.T) {
	p := ledgered(gridPolicy(10, 1, time.Hour), time.Hour)
	s, first := must(t, p, State{}, t0, Op{Kind: OpCharge, Amount: 3, ID: "x"})
	for _, op := range []Op{{Kind: OpCharge, Amount: 4, ID: "x"}, {Kind: OpDebit, Amount: 3, ID: "x"}, {Kind: OpRefund, Amount: 3, ID: "x"}} {
		if _, _, err := Apply(p, s, t0, op); !errors.Is(err, ErrRequestMismatch) {
			t.Fatalf("%+v: %v", op, err)
		}
	}
	ns, c := must(t, p, s, t0.Add(time.Minute), Op{Kind: OpCharge, Amount: 3, ID: "x"})
	if !c.Replayed || c.Outcome != first.Outcome || !reflect.DeepEqual(ns, s) {
		t.Fatalf("replay: %+v", c)
	}
	// Past its retention the ID names a new charge.
	if _, c := must(t, p, s, t0.Add(time.Hour), Op{Kind: OpCharge, Amount: 4, ID: "x"}); c.Replayed || c.Remaining != 4 {
		t.Fatalf("after retention: %+v", c)
	}
	if _, _, err := Apply(p, s, t0.Add(time.Hour), Op{Kind: OpSettle, Amount: 4, ID: "x"}); !errors.Is(err, ErrUnknownRequest) {
		t.Fatalf("settle after retention: %v", err)
	}
}

func TestRefundToAGrantThatExpiredIsGone(t *testing.T) {
	p := ledgered(gridPolicy(10, 10, 24*time.Hour), time.Hour)
	s, _ := must(t, p, State{}, t0, Op{Kind: OpGrant, Amount: 5, GrantID: 1, ExpiresAt: t0.Add(time.Minute)})
	s, _ = must(t, p, s, t0, Op{Kind: OpCharge, Amount: 15, ID: "a"})
	_, c := must(t, p, s, t0.Add(time.Minute), Op{Kind: OpSettle, Amount: 0, ID: "a"})
	if c.Remaining != 10 || c.Granted != 0 {
		t.Fatalf("%+v", c.Outcome)
	}
}

func TestSaturation(t *testing.T) {
	p := ledgered(gridPolicy(math.MaxInt64, math.MaxInt64, time.Nanosecond), time.Hour)
	s, _ := must(t, p, State{}, t0, Op{Kind: OpGrant, Amount: math.MaxInt64, GrantID: 1})
	s, c := must(t, p, s, t0, Op{Kind: OpGrant, Amount: math.MaxInt64, GrantID: 2})
	if c.Granted != math.MaxInt64 || c.Remaining != math.MaxInt64 {
		t.Fatalf("%+v", c.Outcome)
	}
	s, c = must(t, p, s, t0, Op{Kind: OpDebit, Amount: math.MaxInt64})
	for i := range 4 {
		s, c = must(t, p, s, t0, Op{Kind: OpDebit, Amount: math.MaxInt64})
		if c.Remaining < -math.MaxInt64 {
			t.Fatalf("debit %d: %+v", i, c.Outcome)
		}
	}
	if o := Look(p, s, t0, 1); o.Allowed {
		t.Fatalf("%+v", o)
	}
	_ = fmt.Sprint()
}

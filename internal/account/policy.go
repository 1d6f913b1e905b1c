package account

import (
	"math"
	"time"
)

// ExpiryGranularity is what a bucket's ExpiresAt is rounded up to. Coarse
// rounding keeps it unchanged across most writes of a busy row.
const ExpiryGranularity = time.Minute

// Policy is a key's account: a bucket of at most Capacity tokens, Refill
// more at every boundary of Schedule (Capacity and Refill are > 0), and the
// parts it keeps besides: its grants (Grants: spent after the bucket), a
// ledger (Ledger: a Change has its entries, a grant made is marked so), and
// the records of request IDs, each remembered for Retention.
type Policy struct {
	Capacity  int64
	Refill    int64
	Schedule  Schedule
	Grants    bool
	Ledger    bool
	Retention time.Duration
}

// Bucket is a key's bucket as stored: Tokens as of RefilledAt, a boundary of
// the schedule (negative: a debt). A bucket whose ExpiresAt has passed is full
// and reads exactly as a missing one, and so does a placeholder (RefilledAt
// the zero time) that a transaction inserted and never wrote. Capacity is the
// policy's Capacity when it was last written (0: unknown, as for rows of
// older releases): a check under another Capacity is a plan change.
type Bucket struct {
	Tokens     int64
	RefilledAt time.Time
	ExpiresAt  time.Time
	Capacity   int64
}

// Same says whether b and o are the same stored bucket.
func (b Bucket) Same(o Bucket) bool {
	return b.Tokens == o.Tokens && b.RefilledAt.Equal(o.RefilledAt) && b.ExpiresAt.Equal(o.ExpiresAt) && b.Capacity == o.Capacity
}

// Fresh is the bucket of a key never seen before (or deleted, or expired):
// full, as of the latest boundary of the schedule. The phase is the
// schedule's, not the row's, so a bucket deleted once full and created again
// refills at the same moments as one that was kept: cleanup never changes a
// decision.
func (p Policy) Fresh(now time.Time) Bucket {
	return Bucket{Tokens: p.Capacity, RefilledAt: p.Schedule.Floor(now), ExpiresAt: now, Capacity: p.Capacity}
}

// Load brings a stored bucket to now under p and says by how much a change
// of plan moved its tokens. A missing, placeholder or expired bucket is
// Fresh. A bucket last written under another Capacity changes plan first,
// as of its last write: a bigger plan adds the difference at once (a
// customer who moves from 1,000 to 5,000 a month has 4,000 more now), a
// smaller one clamps the tokens to its Capacity. Then every boundary in
// (RefilledAt, now] adds Refill tokens, capped at Capacity; RefilledAt moves
// to the last of them, also when the cap cuts the refill short, and never
// backwards: a clock behind RefilledAt adds nothing.
func (p Policy) Load(b Bucket, now time.Time) (loaded Bucket, plan int64) {
	if !now.Before(b.ExpiresAt) || b.RefilledAt.IsZero() {
		return p.Fresh(now), 0
	}
	t := b.Tokens
	if b.Capacity > 0 && p.Capacity > b.Capacity {
		t = AddSat(t, p.Capacity-b.Capacity)
	}
	t = min(t, p.Capacity) // a debt stays: refills repay it
	plan = subSat(t, b.Tokens)
	b.Tokens, b.Capacity = t, p.Capacity
	if n := p.Schedule.Count(b.RefilledAt, now); n > 0 {
		b.Tokens = min(AddSat(b.Tokens, mulSat(n, p.Refill)), p.Capacity)
		b.RefilledAt = p.Schedule.Add(b.RefilledAt, n) // the latest boundary <= now
	}
	return b, plan
}

// refillsFor is how many refills bring need more tokens (need > 0).
func (p Policy) refillsFor(need int64) int64 {
	refills := need / p.Refill
	if need%p.Refill != 0 {
		refills++
	}
	return refills
}

// UntilTokens is how long after now the loaded bucket b holds at least want
// tokens if nothing takes any: until the boundary that brings the refills it
// lacks (a debt adds to them), or until its row expires, if that is sooner
// (a row past its expiry reads as a full bucket: one written under another
// plan may expire before this plan's refills fill it). Zero if it already
// does; Inf if refills never can (want above Capacity).
func (p Policy) UntilTokens(b Bucket, now time.Time, want int64) time.Duration {
	d := p.untilTokens(b, now, want)
	if d > 0 && want <= p.Capacity && b.ExpiresAt.After(now) {
		d = min(d, untilSat(b.ExpiresAt, now))
	}
	return d
}

// untilTokens is UntilTokens by the refills alone.
func (p Policy) untilTokens(b Bucket, now time.Time, want int64) time.Duration {
	need := AddSat(want, -max(b.Tokens, -math.MaxInt64))
	if need <= 0 {
		return 0
	}
	if want > p.Capacity {
		return Inf
	}
	return untilSat(p.refilledBy(b, need), now)
}

// refilledBy is the boundary by which the refills of the loaded bucket b
// add need tokens (need > 0), saturating at MaxTime: an instant, which
// reaches further than a time.Duration from now can.
func (p Policy) refilledBy(b Bucket, need int64) time.Time {
	return p.Schedule.Add(b.RefilledAt, p.refillsFor(need))
}

// Horizon is how long after a new row's first check, of cost, the bucket is
// full again, at most: the refills that cost takes, each the schedule's
// longest period, saturating. The engine stores it in a placeholder row's
// expiry, which reads as missing whatever it holds: the bound only makes the
// first write more likely to leave the expiry unchanged.
func (p Policy) Horizon(cost int64) time.Duration {
	if cost <= 0 {
		return 0
	}
	return durMulSat(p.Schedule.Longest(), p.refillsFor(min(cost, p.Capacity)))
}

// expiry is the ExpiresAt to store for the loaded bucket b at now: when it is
// full again, rounded up to ExpiryGranularity, never before the one it has
// (a row only ever moves its expiry forward). It is the instant of the
// refill that fills it (saturating at MaxTime), not now plus a wait: a wait
// longer than a time.Duration saturates, and a row that expired before its
// bucket is full would read as a full one.
func (p Policy) expiry(b Bucket, now time.Time) time.Time {
	full := now
	if need := AddSat(p.Capacity, -max(b.Tokens, -math.MaxInt64)); need > 0 {
		if at := p.refilledBy(b, need); at.After(now) {
			full = at
		}
	}
	e := roundUp(full, ExpiryGranularity)
	if e.Before(b.ExpiresAt) {
		return b.ExpiresAt
	}
	return e
}

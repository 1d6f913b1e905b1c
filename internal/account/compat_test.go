package account

import "time"

// The names the policy and schedule tests were written with, before the
// bucket math moved here from the root package.

// unixEpoch is the phase of every grid.
var unixEpoch = time.Unix(0, 0).UTC()

type (
	bucket = Bucket
	policy = Policy
	Result = Outcome
)

// cal is a calendar as Config.Calendar gives it: its schedule for a key is
// Calendar of its period and zone, at the key's anchor or its own.
type cal struct {
	Every    Period
	Location *time.Location
	Anchor   time.Time
}

func (c cal) at(key time.Time) Schedule {
	if key.IsZero() {
		key = c.Anchor
	}
	return Calendar(c.Every, c.Location, key)
}

func (p Policy) load(b Bucket, now time.Time) Bucket {
	l, _ := p.Load(b, now)
	return l
}

func (p Policy) fresh(now time.Time) Bucket { return p.Fresh(now) }

func (p Policy) horizon(cost int64) time.Duration { return p.Horizon(cost) }

// take applies a charge of cost to b (already loaded) at now: the bucket
// written when allowed, b itself when denied.
func (p Policy) take(b Bucket, now time.Time, cost int64) (Bucket, Outcome) {
	s, c, _ := Apply(p, State{Bucket: b}, now, Op{Kind: OpCharge, Amount: cost})
	if !c.Allowed {
		return b, c.Outcome
	}
	return s.Bucket, c.Outcome
}

// give applies a refund of n to b at now.
func (p Policy) give(b Bucket, now time.Time, n int64) (Bucket, Outcome) {
	s, c, _ := Apply(p, State{Bucket: b}, now, Op{Kind: OpRefund, Amount: n})
	return s.Bucket, c.Outcome
}

// same compares the stored parts of buckets, not the Capacity they were
// written under.
func (b Bucket) same(o Bucket) bool {
	return b.Tokens == o.Tokens && b.RefilledAt.Equal(o.RefilledAt) && b.ExpiresAt.Equal(o.ExpiresAt)
}

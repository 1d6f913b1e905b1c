package account

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Op is one operation on a key's account.
type Op struct {
	// Kind is OpCharge, OpDebit, OpRefund, OpSettle, OpGrant, OpReset or
	// OpPlan: a change of plan and nothing else (an override set: the
	// bucket is loaded under the new policy and stored with its Capacity).
	Kind Kind
	// Amount is the cost of a charge, a debit, a refund or a grant (>= 1),
	// or the actual cost of a settlement (>= 0).
	Amount int64
	// ID is the request ID ("": none; a settlement's is required). A charge,
	// debit, refund or grant with an ID happens once per ID on the bucket;
	// a reset ignores it.
	ID string
	// GrantID and ExpiresAt (zero: never) are a grant's.
	GrantID   int64
	ExpiresAt time.Time
}

// Change is what Apply did besides the new State.
type Change struct {
	Outcome
	// Entries are the ledger entries (with Policy.Ledger), in order: plan
	// changes and expiries first, then the operation's. None for a denied
	// operation or a replay.
	Entries []Entry
	// Replayed says the outcome is a record's: nothing changed.
	Replayed bool
	// Record is the record written (a new one, or one just settled).
	Record *Record
	// Grant is the grant made by OpGrant (replayed too).
	Grant Grant
	// Reset says the bucket was reset: the engine deletes its row.
	Reset bool
}

// Apply applies op to s at now under p, and returns the new state. A denied
// operation, a replay and an error leave s as it is. An allowed one leaves
// its Bucket as stored when it did not change the bucket's tokens (the row
// keeps meaning what it meant), else the bucket loaded and changed, with its
// expiry moved forward.
//
// A settlement (OpSettle) brings the charge or debit that its request ID
// recorded to its actual cost: the difference beyond the estimate is taken
// as a debit (also below zero), the difference below it given back where it
// came from (grants first, each only while it is live, then the bucket up to
// Capacity). A settled request settles again only at the same actual cost,
// which changes nothing and returns the first settlement's outcome.
func Apply(p Policy, s State, now time.Time, op Op) (State, Change, error) {
	rec, recorded := s.Records[op.ID]
	recorded = recorded && op.ID != "" && op.Kind != OpReset && rec.Live(now)
	switch {
	case op.Kind == OpSettle && !recorded:
		return s, Change{}, ErrUnknownRequest
	case op.Kind == OpSettle:
		return settle(p, s, now, op, rec)
	case recorded:
		return replay(s, rec, op)
	}
	w := load(p, s, now)
	var spent Spent
	switch op.Kind {
	case OpCharge, OpDebit:
		var ok bool
		if spent, ok = w.take(op.Amount, op.Kind == OpDebit, op.ID != ""); !ok {
			return s, Change{Outcome: Look(p, s, now, op.Amount)}, nil
		}
	case OpRefund:
		w.toBucket(op.Amount)
	case OpGrant:
		if !op.ExpiresAt.IsZero() && !now.Before(op.ExpiresAt) {
			return s, Change{}, ErrGrantExpired
		}
		w.grants = append(w.grants, Grant{ID: op.GrantID, Amount: op.Amount, ExpiresAt: op.ExpiresAt, GrantedAt: now, Ledger: p.Ledger})
	case OpReset:
		w.b = p.Fresh(now)
	case OpPlan:
	}
	if op.ID == "" || op.Kind == OpReset || op.Kind == OpPlan {
		return w.finish(s, op, nil)
	}
	return w.finish(s, op, &Record{Kind: op.Kind, Amount: op.Amount, Spent: spent})
}

// replay answers op from rec, the live record of its ID: the first outcome,
// if op is what rec names.
func replay(s State, rec Record, op Op) (State, Change, error) {
	if op.Kind != rec.Kind || op.Amount != rec.Amount || op.Kind == OpGrant && !op.ExpiresAt.Equal(rec.Grant.ExpiresAt) {
		return s, Change{}, ErrRequestMismatch
	}
	return s, Change{Outcome: rec.Outcome, Replayed: true, Grant: rec.Grant}, nil
}

// settle applies the settlement op to the charge or debit that rec records.
func settle(p Policy, s State, now time.Time, op Op, rec Record) (State, Change, error) {
	switch {
	case rec.Kind != OpCharge && rec.Kind != OpDebit:
		return s, Change{}, ErrRequestMismatch
	case rec.Settled && rec.Actual != op.Amount:
		return s, Change{}, ErrRequestMismatch
	case rec.Settled:
		return s, Change{Outcome: rec.Settlement, Replayed: true}, nil
	}
	w := load(p, s, now)
	switch diff := subSat(op.Amount, rec.Amount); {
	case diff > 0:
		w.take(diff, true, false)
	case diff < 0:
		w.giveBack(-diff, rec.Spent)
	}
	rec.Settled, rec.Actual = true, op.Amount
	return w.finish(s, op, &rec)
}

// Look is what a check of cost would find in s at now, without taking
// anything: Allowed when the balance (tokens plus live grants) covers cost,
// RetryAfter, when it does not, how long until refills make it do if nothing
// else changes (grants that expire meanwhile counted out; Inf when refills
// never can).
func Look(p Policy, s State, now time.Time, cost int64) Outcome {
	b, _ := p.Load(s.Bucket, now)
	g := Granted(s.Grants, now)
	o := Outcome{Allowed: AddSat(b.Tokens, g) >= cost, Limit: p.Capacity, Remaining: b.Tokens, Granted: g,
		ResetAfter: p.UntilTokens(b, now, p.Capacity)}
	if !o.Allowed {
		o.RetryAfter = p.retryAfter(b, s.Grants, now, cost)
	}
	return o
}

// retryAfter is how long after now the loaded bucket b and the grants gs
// hold cost: the first boundary at which the refills so far plus the grants
// still live then cover it.
func (p Policy) retryAfter(b Bucket, gs []Grant, now time.Time, cost int64) time.Duration {
	at := now
	for range len(gs) + 1 {
		need := subSat(cost, Granted(gs, at))
		if need > p.Capacity {
			return Inf // grants only shrink, and the bucket holds Capacity at most
		}
		wait := p.UntilTokens(b, now, need)
		if wait == Inf {
			return Inf
		}
		then := timeAddSat(now, wait)
		next, ok := firstExpiry(gs, at, then)
		if !ok {
			return wait
		}
		at = next // a grant expires by then: count without it
	}
	return Inf
}

// firstExpiry is the soonest expiry in (now, until] of a grant live at now.
func firstExpiry(gs []Grant, now, until time.Time) (time.Time, bool) {
	var first time.Time
	for _, g := range gs {
		if g.Live(now) && !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(until) && (first.IsZero() || g.ExpiresAt.Before(first)) {
			first = g.ExpiresAt
		}
	}
	return first, !first.IsZero()
}

// work is an operation under way: s's bucket loaded, its grants copied in
// spend order with the expired ones emptied, the balance then, and the
// entries so far (with a ledger).
type work struct {
	p       Policy
	now     time.Time
	b       Bucket // loaded
	loaded  int64  // the loaded bucket's tokens, before the operation
	plan    int64
	grants  []Grant
	entries []Entry
	// before and grantedBefore are the balance and its live grants once
	// loaded, before the operation.
	before, grantedBefore int64
}

func load(p Policy, s State, now time.Time) work {
	b, plan := p.Load(s.Bucket, now)
	w := work{p: p, now: now, b: b, loaded: b.Tokens, plan: plan, grants: slices.Clone(s.Grants)}
	slices.SortFunc(w.grants, CompareGrants)
	balance := AddSat(b.Tokens, sumAmounts(w.grants))
	if plan != 0 && p.Ledger {
		w.entries = append(w.entries, Entry{Kind: OpPlan, Amount: plan, Balance: balance, Granted: sumAmounts(w.grants)})
	}
	for i, g := range w.grants {
		if g.Amount > 0 && !g.Live(now) {
			w.grants[i].Amount = 0
			balance = subSat(balance, g.Amount)
			if p.Ledger {
				w.entries = append(w.entries, Entry{Kind: OpExpire, Amount: -g.Amount, GrantsAmount: -g.Amount, Balance: balance, Granted: sumAmounts(w.grants)})
			}
		}
	}
	w.before, w.grantedBefore = balance, sumAmounts(w.grants)
	return w
}

// sumAmounts adds up the amounts of gs, saturating.
func sumAmounts(gs []Grant) int64 {
	var sum int64
	for _, g := range gs {
		sum = AddSat(sum, g.Amount)
	}
	return sum
}

// take takes n: from the bucket's tokens first, then from the grants in
// order, and (debt) the rest as a debt; without debt only when the balance
// covers n. With where, it says where it took from.
func (w *work) take(n int64, debt, where bool) (Spent, bool) {
	g := Granted(w.grants, w.now)
	if !debt && AddSat(w.b.Tokens, g) < n {
		return Spent{}, false
	}
	sp := Spent{Known: true, Bucket: min(max(w.b.Tokens, 0), n)}
	w.b.Tokens -= sp.Bucket
	left := n - sp.Bucket
	if left > 0 {
		sp.Grants = w.spendGrants(left)
		for _, part := range sp.Grants {
			left -= part.Amount
		}
	}
	if !where {
		sp = Spent{}
	}
	if left > 0 {
		w.b.Tokens = max(subSat(w.b.Tokens, left), -math.MaxInt64) // a debt; -MaxInt64 at most, so that it negates
	}
	return sp, true
}

// spendGrants takes up to n from the live grants in order and returns what
// it took from each.
func (w *work) spendGrants(n int64) []Grant {
	var parts []Grant
	for i := range w.grants {
		g := &w.grants[i]
		if n == 0 {
			break
		}
		if g.Live(w.now) {
			x := min(g.Amount, n)
			g.Amount -= x
			n -= x
			parts = append(parts, Grant{ID: g.ID, Amount: x, ExpiresAt: g.ExpiresAt, Ledger: g.Ledger})
		}
	}
	return parts
}

// toBucket adds n to the bucket, capped at Capacity.
func (w *work) toBucket(n int64) {
	if w.b.Tokens < w.p.Capacity {
		w.b.Tokens = min(AddSat(w.b.Tokens, n), w.p.Capacity)
	}
}

// giveBack gives n back where sp took it: to its grants, the last spent
// first, each up to what was taken from it and only while it is live (what
// an expired grant gets back expires with it); the rest to the bucket,
// capped at Capacity. A record that does not say where gives all to the
// bucket.
func (w *work) giveBack(n int64, sp Spent) {
	if sp.Known {
		for i := len(sp.Grants) - 1; i >= 0 && n > 0; i-- {
			part := sp.Grants[i]
			x := min(part.Amount, n)
			n -= x
			part.Amount = x
			if !part.Live(w.now) {
				continue
			}
			if j := slices.IndexFunc(w.grants, func(g Grant) bool { return g.ID == part.ID }); j >= 0 {
				w.grants[j].Amount = AddSat(w.grants[j].Amount, x)
			} else {
				w.grants = append(w.grants, part) // spent to nothing and gone: made again
				slices.SortFunc(w.grants, CompareGrants)
			}
		}
	}
	w.toBucket(n)
}

// finish ends an allowed operation: a debt is repaid from the live grants,
// the bucket's expiry moves forward if it changed, and the outcome, the
// entry, the record (rec, when op has an ID) and the new state are made.
func (w *work) finish(s State, op Op, rec *Record) (State, Change, error) {
	if w.b.Tokens < 0 {
		for _, part := range w.spendGrants(-w.b.Tokens) {
			w.b.Tokens += part.Amount
		}
	}
	ns := State{Bucket: s.Bucket, Grants: w.grants, Records: s.Records}
	if w.b.Tokens != w.loaded || w.plan != 0 || op.Kind == OpReset || op.Kind == OpPlan && w.b.Capacity != s.Bucket.Capacity {
		w.b.ExpiresAt = w.p.expiry(w.b, w.now)
		ns.Bucket = w.b
	}
	o := w.outcome()
	switch op.Kind {
	case OpCharge, OpDebit, OpSettle:
		o.FromGrants = subSat(w.grantedBefore, o.Granted)
	}
	c := Change{Outcome: o, Reset: op.Kind == OpReset}
	if w.p.Ledger {
		c.Entries = w.entries
		if amount := subSat(AddSat(o.Remaining, o.Granted), w.before); amount != 0 || op.Kind == OpCharge {
			c.Entries = append(c.Entries, Entry{Kind: op.Kind, Amount: amount, GrantsAmount: subSat(o.Granted, w.grantedBefore),
				Balance: AddSat(o.Remaining, o.Granted), Granted: o.Granted})
		}
	}
	if op.Kind == OpGrant {
		c.Grant = w.grants[slices.IndexFunc(w.grants, func(g Grant) bool { return g.ID == op.GrantID })]
	}
	if rec != nil {
		if op.Kind == OpSettle {
			rec.Settlement = o
		} else {
			*rec = Record{Kind: rec.Kind, Amount: rec.Amount, Outcome: o, Spent: rec.Spent, Grant: c.Grant,
				CreatedAt: w.now, ExpiresAt: timeAddSat(w.now, w.p.Retention)}
		}
		ns.Records = maps.Clone(s.Records)
		if ns.Records == nil {
			ns.Records = make(map[string]Record, 1)
		}
		ns.Records[op.ID] = *rec
		c.Record = rec
	}
	return ns, c, nil
}

// outcome is what an allowed operation reports.
func (w *work) outcome() Outcome {
	return Outcome{Allowed: true, Limit: w.p.Capacity, Remaining: w.b.Tokens, Granted: Granted(w.grants, w.now),
		ResetAfter: w.p.UntilTokens(w.b, w.now, w.p.Capacity)}
}

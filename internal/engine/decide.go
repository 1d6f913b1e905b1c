package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Deciding: the account model (internal/account) owns what every operation
// does to a balance; decide applies it to the accounts an attempt locked and
// notes what to write besides them.

// op is the account operation of q on charge c.
func (q *Request) op(c Charge, grantID int64) account.Op {
	op := account.Op{Kind: q.Kind, Amount: c.Cost, ID: q.ID, GrantID: grantID, ExpiresAt: q.Expires}
	if q.Kind == account.OpSettle {
		op.Amount = q.Actual
	}
	return op
}

// decideOne applies q to the accounts a holds, all or nothing, and records its
// outcome; when it is allowed, a's accounts take their new state and a notes
// what to write besides them (records, ledger entries, resets). A denied
// request, a replay and an error change nothing.
func (a *Attempt) decideOne(q *Request) {
	if q.Kind == account.OpPlan {
		a.decidePlan(q)
		return
	}
	if err := a.replays(q); err != nil {
		q.Err = err
		return
	}
	// On the stack for the usual few charges (they do not escape).
	var newsBuf [4]account.State
	var changesBuf [4]account.Change
	news, changes := newsBuf[:0], changesBuf[:0]
	if n := len(q.Charges); n > len(newsBuf) {
		news, changes = make([]account.State, 0, n), make([]account.Change, 0, n)
	}
	news, changes = news[:len(q.Charges)], changes[:len(q.Charges)]
	charges := a.effective(q.Charges)
	allowed := true
	for i, c := range charges {
		if err := a.shared(c); err != nil {
			q.Err = err
			return
		}
		var err error
		if c.Part != nil {
			changes[i].Outcome, err = c.Part.Decide(a, q, c)
		} else {
			news[i], changes[i], err = account.Apply(c.Policy, *a.state[c.Row], a.now, q.op(c, a.grantID))
		}
		if err != nil {
			q.Err = requestError(err, q, c)
			return
		}
		allowed = allowed && changes[i].Allowed
	}
	outs := make([]Outcome, len(q.Charges))
	for i, c := range charges {
		outs[i].Outcome = changes[i].Outcome
		if allowed && c.Part == nil {
			outs[i].Replayed = changes[i].Replayed
		}
		var before account.Outcome
		if c.Part == nil && (c.Observer != nil || !allowed && changes[i].Allowed) {
			before = account.Look(c.Policy, *a.state[c.Row], a.now, c.Cost)
		}
		if !allowed && changes[i].Allowed && c.Part == nil {
			// This bucket had enough, another did not: nothing is taken.
			outs[i].Outcome = before
		}
		if c.Observer != nil {
			c.Observer.Observe(a, q, c, before, changes[i], allowed)
		}
		switch {
		case !allowed:
		case c.Part != nil:
			c.Part.Take(a, q, c)
		default:
			a.apply(q, c, news[i], changes[i])
		}
	}
	q.Allowed, q.Outcomes = allowed, outs
}

// effective returns cs with each charge's policy the one that decides it
// (policyOf): cs itself when no override applies.
func (a *Attempt) effective(cs []Charge) []Charge {
	if len(a.overrides) == 0 {
		return cs
	}
	out := cs
	for i, c := range cs {
		if p := a.policyOf(c); p.Capacity != c.Policy.Capacity || p.Refill != c.Policy.Refill {
			if len(out) > 0 && &out[0] == &cs[0] {
				out = slices.Clone(cs)
			}
			out[i].Policy = p
		}
	}
	return out
}

// decidePlan decides q, an OpPlan request on one key: it sets the key's
// override and changes the bucket's plan to it at once (a bigger Capacity
// adds the difference, a smaller one clamps; the ledger's "plan" row), or
// clears it (the charge's policy applies again from the next operation
// that locks the row). Its outcome is the key's bucket as Peek reports it
// afterwards.
func (a *Attempt) decidePlan(q *Request) {
	c := q.Charges[0]
	st := a.state[c.Row]
	p := c.Policy
	if o := q.Override; o != nil {
		p = o.Policy(c.Policy)
		ns, ch, err := account.Apply(p, *st, a.now, account.Op{Kind: account.OpPlan})
		if err != nil {
			q.Err = requestError(err, q, c)
			return
		}
		a.apply(q, c, ns, ch)
		a.setOverride(c.Row, *o)
	} else {
		delete(a.overrides, c.Row)
	}
	a.overrideWrites = append(a.overrideWrites, overrideWrite{row: c.Row, o: q.Override})
	q.Allowed, q.Outcomes = true, []Outcome{{Outcome: account.Look(p, *st, a.now, 1)}}
}

// replays checks that q's request ID names a request on all of its buckets
// or on none: one call's ID on some of them is another call.
func (a *Attempt) replays(q *Request) error {
	if q.ID == "" || len(q.Charges) < 2 {
		return nil
	}
	n, balances := 0, 0
	for _, c := range q.Charges {
		if c.Part != nil {
			continue // a part keeps its own record of the ID
		}
		balances++
		if rec, ok := a.state[c.Row].Records[q.ID]; ok && rec.Live(a.now) {
			n++
		}
	}
	if n > 0 && n < balances {
		return fmt.Errorf("%w: request %q names a call on %d of its %d buckets", account.ErrRequestMismatch, q.ID, n, balances)
	}
	return nil
}

// apply makes ns, the state an allowed request left c's account in, the
// account's, and notes what else to write.
func (a *Attempt) apply(q *Request, c Charge, ns account.State, ch account.Change) {
	*a.state[c.Row] = ns
	if q.Kind == account.OpGrant {
		q.Grant = ch.Grant
	}
	if ch.Replayed {
		return
	}
	if ch.Record != nil {
		a.records = append(a.records, recordWrite{row: c.Row, id: q.ID, rec: *ch.Record})
	}
	if ch.Reset {
		a.resets = append(a.resets, c.Row)
	}
	if c.Policy.Ledger {
		for _, e := range ch.Entries {
			a.ledger = append(a.ledger, []any{c.Row.Prefix, c.Row.Key, a.now, e.Amount, e.Kind.String(), q.ID,
				e.Balance, e.GrantsAmount, e.Granted})
		}
	}
}

// shared fails a Part's charge on a row that holds a bucket's balance (a
// limiter's: a placeholder's refilled_at is the zero time). A Limiter and a
// Semaphore with the same Prefix and Storage would share their keys' rows.
// (A bucket's charge cannot tell a row with leases: its transaction reads
// no leases unless a Part's charge shares it, and its answer must not
// depend on that.)
func (a *Attempt) shared(c Charge) error {
	if c.Part == nil || a.state[c.Row].Bucket.RefilledAt.IsZero() {
		return nil
	}
	return fmt.Errorf("%w: the row of %s of prefix %q holds a limiter's bucket: a Limiter and a Semaphore cannot share a Prefix and Storage", ErrInvalidConfig, QuoteKey(c.Row.Key), c.Row.Prefix)
}

// requestError is err of the account model for q on c, with what it was.
func requestError(err error, q *Request, c Charge) error {
	switch {
	case errors.Is(err, account.ErrGrantExpired):
		return fmt.Errorf("%w: expires %s, the check's clock reads later", err, q.Expires.Format(time.RFC3339Nano))
	case q.ID != "":
		return fmt.Errorf("%w: request %q on %s of prefix %q", err, q.ID, QuoteKey(c.Row.Key), c.Row.Prefix)
	}
	return err
}

// CheckText reports why s is not a valid key, prefix or ID of at most
// maxLen bytes, or "": it must be non-empty, valid UTF-8 and hold no NUL.
func CheckText(s string, maxLen int) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes, longer than %d", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "contains a NUL byte"
		}
	}
	return ""
}

// QuoteKey shortens and quotes a key for error messages.
func QuoteKey(key string) string {
	if len(key) > 64 {
		key = key[:64] + "..."
	}
	return fmt.Sprintf("key %q", key)
}

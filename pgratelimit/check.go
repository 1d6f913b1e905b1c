package pgratelimit

import (
	"context"
	"math"
	"strings"
	"time"
)

// Checks: what a check asks of which buckets, and how it is decided on the
// buckets as read (no I/O here; the engine reads and writes them, the math is
// bucket.go's). A request is one Allow, AllowN, Refund or AllowAll call; the
// engine decides any number of them in one transaction, in order, each all or
// nothing, exactly as one by one.

// row identifies a bucket: its table and primary key.
type row struct {
	storage     Storage
	prefix, key string
}

func compareRows(a, b row) int {
	if a.storage != b.storage {
		return int(a.storage) - int(b.storage)
	}
	if c := strings.Compare(a.prefix, b.prefix); c != 0 { // byte order, as the tables' COLLATE "C"
		return c
	}
	return strings.Compare(a.key, b.key)
}

// charge is what a request takes from (or gives to) one bucket: the costs of
// every Charge of that bucket added up, decided by the first one's policy.
type charge struct {
	row       row
	policy    policy
	cost      int64
	grants    bool          // spend the key's grants after the bucket (Config.Grants)
	ledger    bool          // write ledger rows (Config.Ledger)
	retention time.Duration // how long the bucket remembers request IDs
}

// request is one check (or another change of buckets): one or more charges
// decided together, all or nothing, and its outcome.
type request struct {
	ctx     context.Context
	charges []charge // one per distinct bucket
	of      []int    // Charge i of the call is charges[of[i]]; nil: one Charge
	op      op
	id      string    // the request ID (WithRequestID); "" for none
	actual  int64     // opSettle: the actual cost
	expires time.Time // opGrant: the grant's expiry (zero: never)

	out    MultiResult
	err    error
	grant  Grant // opGrant: the grant made
	gained int64 // opSettle: what the balance gained (negative: charged beyond the estimate)
}

// op is what a request does to its buckets.
type op int8

const (
	opTake   op = iota // a check: take the cost if the bucket (and grants) hold it
	opGive             // Refund: add the cost, capped at Capacity
	opDebit            // Debit, and a settlement past its estimate: take the cost, also below zero
	opGrant            // Grant: a grant of the cost, beside the bucket
	opReset            // Reset with Config.Ledger: the bucket full again
	opSettle           // Settle: the charge of a request ID brought to its actual cost
)

// ledgerKind is the ledger's word for what op did.
func (o op) ledgerKind() string {
	return [...]string{opTake: "charge", opGive: "refund", opDebit: "debit", opGrant: "grant", opReset: "reset", opSettle: "settle"}[o]
}

// rows returns the request's distinct rows.
func (q *request) rows() []row {
	rs := make([]row, len(q.charges))
	for i, c := range q.charges {
		rs[i] = c.row
	}
	return rs
}

// decide applies q to the buckets as stored (brought to now by each charge's
// policy) and, for charges with grants, to the key's grants, and records its
// outcome; when it is allowed, stored and grants take the new state. A
// denied request changes nothing, exactly as if the rows had been read from
// the tables one check at a time.
func (q *request) decide(stored map[row]bucket, grants map[row][]grant, now time.Time) {
	results := make([]Result, len(q.charges))
	var buf [2 * 4]bucket // next and loaded of up to 4 charges, without allocating
	next, loaded := buf[:0:4], buf[4:4]
	if len(q.charges) > 4 {
		next, loaded = make([]bucket, 0, len(q.charges)), make([]bucket, 0, len(q.charges))
	}
	next, loaded = next[:len(q.charges)], loaded[:len(q.charges)]
	var spent [][]grant // the grants after each charge; nil unless a charge has grants
	allowed := true
	for i, c := range q.charges {
		loaded[i] = c.policy.load(stored[c.row], now)
		switch {
		case q.op == opTake && c.grants:
			if spent == nil {
				spent = make([][]grant, len(q.charges))
			}
			next[i], spent[i], results[i] = c.policy.takeWithGrants(loaded[i], grants[c.row], now, c.cost)
		case q.op == opTake:
			next[i], results[i] = c.policy.take(loaded[i], now, c.cost)
		default:
			next[i], results[i] = c.policy.apply(q.op, loaded[i], now, c.cost)
			if c.grants {
				results[i].Granted = granted(grants[c.row], now)
				if q.op == opGrant {
					results[i].Granted = addSat(results[i].Granted, c.cost)
				}
			}
		}
		allowed = allowed && results[i].Allowed
	}
	var retry time.Duration
	for i, c := range q.charges {
		switch {
		case !allowed && results[i].Allowed:
			// This bucket had enough, another did not: nothing is taken.
			results[i] = c.policy.result(loaded[i], now, c.cost, true)
			if c.grants {
				results[i].Granted = granted(grants[c.row], now)
			}
		case allowed && q.op != opReset && (q.op == opTake || !next[i].same(loaded[i])):
			// (A refund to a full bucket, a grant, writes nothing: the row
			// keeps meaning what it meant, e.g. a missing row stays
			// missing. A reset deletes the row: see attempt.decide.)
			stored[c.row] = next[i]
			if spent != nil && spent[i] != nil {
				grants[c.row] = spent[i]
			}
		}
		retry = max(retry, results[i].RetryAfter)
	}
	q.out = MultiResult{Allowed: allowed, Results: results}
	if !allowed {
		q.out.RetryAfter = retry
	}
	if q.of != nil {
		q.out.Results = make([]Result, len(q.of))
		for i, j := range q.of {
			q.out.Results[i] = results[j]
		}
	}
}

// apply applies an op other than opTake to the loaded bucket b: it is always
// allowed.
func (p policy) apply(o op, b bucket, now time.Time, n int64) (bucket, Result) {
	switch o {
	case opGive:
		return p.give(b, now, n)
	case opDebit:
		b.tokens = max(addSat(b.tokens, -n), -math.MaxInt64) // a debt; -MaxInt64 at most, so that it negates
		r := p.result(b, now, 0, true)
		b.expiresAt = p.expiry(b, now, r.ResetAfter)
		return b, r
	case opReset:
		b = p.fresh(now)
	}
	return b, p.result(b, now, 0, true)
}

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Checks: what a request asks of which buckets, and how the engine decides
// it on the accounts as read (the account model, internal/account, owns what
// every operation does to a balance; this file applies it and notes what to
// write). A request is one Allow, AllowN, AllowAll, Refund, Debit, Settle,
// Grant or Reset call; the engine decides any number of them in one
// transaction, in order, each all or nothing, exactly as one by one.

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

// charge is what a request does to one bucket: the costs of every Charge of
// that bucket added up, decided by the first one's policy.
type charge struct {
	row       row
	policy    account.Policy
	cost      int64
	grants    bool          // the key's grants are part of its account (Config.Grants)
	ledger    bool          // write ledger entries (Config.Ledger)
	retention time.Duration // how long the bucket remembers request IDs
}

// request is one call: one or more charges decided together, all or
// nothing, and its outcome.
type request struct {
	ctx     context.Context
	charges []charge // one per distinct bucket
	of      []int    // Charge i of the call is charges[of[i]]; nil: one Charge
	kind    account.Kind
	id      string    // the request ID (WithRequestID); "" for none
	actual  int64     // OpSettle: the actual cost
	expires time.Time // OpGrant: the grant's expiry (zero: never)

	out   MultiResult
	err   error
	grant Grant // OpGrant: the grant made
}

// rows returns the request's distinct rows.
func (q *request) rows() []row {
	rs := make([]row, len(q.charges))
	for i, c := range q.charges {
		rs[i] = c.row
	}
	return rs
}

// op is the account operation of q on charge c.
func (q *request) op(c charge, grantID int64) account.Op {
	op := account.Op{Kind: q.kind, Amount: c.cost, ID: q.id, Retention: c.retention,
		GrantID: grantID, ExpiresAt: q.expires, Ledger: c.ledger}
	if q.kind == account.OpSettle {
		op.Amount = q.actual
	}
	return op
}

// decide applies q to the accounts a holds, in order, all or nothing, and
// records its outcome; when it is allowed, a's accounts take their new
// state and a notes what to write besides them (records, ledger entries,
// resets). A denied request, a replay and an error change nothing.
func (a *attempt) decide(q *request) {
	if err := a.replays(q); err != nil {
		q.err = err
		return
	}
	results := make([]Result, len(q.charges))
	news := make([]account.State, len(q.charges))
	changes := make([]account.Change, len(q.charges))
	allowed := true
	for i, c := range q.charges {
		var err error
		news[i], changes[i], err = account.Apply(c.policy, *a.state[c.row], a.now, q.op(c, a.grantID))
		if err != nil {
			q.err = requestError(err, q, c)
			return
		}
		allowed = allowed && changes[i].Allowed
	}
	var retry time.Duration
	for i, c := range q.charges {
		results[i] = resultOf(changes[i].Outcome)
		if !allowed && changes[i].Allowed {
			// This bucket had enough, another did not: nothing is taken.
			results[i] = resultOf(account.Look(c.policy, *a.state[c.row], a.now, c.cost))
		}
		retry = max(retry, results[i].RetryAfter)
		if allowed {
			a.apply(q, c, news[i], changes[i])
		}
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

// replays checks that q's request ID names a request on all of its buckets
// or on none: one call's ID on some of them is another call.
func (a *attempt) replays(q *request) error {
	if q.id == "" || len(q.charges) < 2 {
		return nil
	}
	n := 0
	for _, c := range q.charges {
		if rec, ok := a.state[c.row].Records[q.id]; ok && rec.Live(a.now) {
			n++
		}
	}
	if n > 0 && n < len(q.charges) {
		return fmt.Errorf("%w: request %q names a call on %d of its %d buckets", ErrRequestMismatch, q.id, n, len(q.charges))
	}
	return nil
}

// apply makes ns, the state an allowed request left c's account in, the
// account's, and notes what else to write.
func (a *attempt) apply(q *request, c charge, ns account.State, ch account.Change) {
	*a.state[c.row] = ns
	if ch.Replayed {
		if q.kind == account.OpGrant {
			q.grant = grantOf(ch.Grant)
		}
		return
	}
	if ch.Record != nil {
		a.records = append(a.records, recordWrite{row: c.row, id: q.id, rec: *ch.Record})
	}
	if ch.Reset {
		a.resets = append(a.resets, c.row)
	}
	if q.kind == account.OpGrant {
		q.grant = grantOf(ch.Grant)
	}
	if c.ledger {
		for _, e := range ch.Entries {
			a.ledger = append(a.ledger, []any{c.row.prefix, c.row.key, a.now, e.Amount, e.Kind.String(), q.id,
				e.Balance, e.GrantsAmount, e.Granted})
		}
	}
}

// requestError is err of the account model for q on c, with what it was.
func requestError(err error, q *request, c charge) error {
	switch {
	case errors.Is(err, account.ErrGrantExpired):
		return fmt.Errorf("%w: expires %s, the check's clock reads later", ErrGrantExpired, q.expires.Format(time.RFC3339Nano))
	case q.id != "":
		return fmt.Errorf("%w: request %q on %s of prefix %q", err, q.id, quoteKey(c.row.key), c.row.prefix)
	}
	return err
}

// resultOf is the Result of an outcome of the account model.
func resultOf(o account.Outcome) Result {
	return Result{Allowed: o.Allowed, Limit: o.Limit, Remaining: o.Remaining, RetryAfter: o.RetryAfter,
		ResetAfter: o.ResetAfter, Granted: o.Granted}
}

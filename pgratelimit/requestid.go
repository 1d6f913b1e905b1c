package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Request IDs (idempotency keys): an allowed check that carries one leaves a
// row in pgratelimit_requests, per bucket, in its own transaction, with the
// outcome it got. A later check with the same ID on the same buckets finds
// those rows (read in the statements that lock the buckets, so in the same
// round trip) and returns that outcome without charging again. Every writer
// of a bucket's request rows holds the bucket's row lock, so two checks with
// one ID cannot both charge: the second waits for the first, then reads its
// row.

// ErrInvalidRequestID is returned for a request ID that is empty, longer
// than MaxRequestIDLen bytes, not valid UTF-8, or holds a NUL byte.
var ErrInvalidRequestID = errors.New("pgratelimit: invalid request ID")

// ErrUnknownRequest is returned by Settle when no allowed check with that
// request ID is remembered for the key: it was never allowed, or it was
// forgotten after Config.RequestIDRetention.
var ErrUnknownRequest = errors.New("pgratelimit: no allowed check with this request ID is remembered for the key")

// MaxRequestIDLen is the longest request ID, in bytes.
const MaxRequestIDLen = 256

// DefaultRequestIDRetention is how long request IDs are remembered when
// Config.RequestIDRetention is 0.
const DefaultRequestIDRetention = 24 * time.Hour

type requestIDKey struct{}

// WithRequestID returns a copy of ctx whose checks carry the request ID id:
// an idempotency key that makes a retry safe. The first allowed check with
// id on a bucket charges it and the database remembers the outcome (for
// Config.RequestIDRetention); a later check with the same id on the same
// bucket (a retry after a lost reply, a timeout, a crash) returns that
// outcome and charges nothing, whichever process sends it, also when both run
// at once. A denied check records nothing, so its retry is decided afresh;
// in the caller's transaction (AllowNTx) the ID is used only if that
// transaction commits. AllowAll with such a context records the ID for each
// of its buckets: one ID names one call, with the same charges. Settle and
// Debit take the ID from the context too.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestID returns ctx's request ID (WithRequestID), checked, or "".
func requestID(ctx context.Context) (string, error) {
	id, ok := ctx.Value(requestIDKey{}).(string)
	if !ok {
		return "", nil
	}
	if why := checkText(id, MaxRequestIDLen); why != "" {
		return "", fmt.Errorf("%w: %s", ErrInvalidRequestID, why)
	}
	return id, nil
}

// idKey is a request ID on one bucket.
type idKey struct {
	r  row
	id string
}

// idRecord is what the first allowed check with an ID left on a bucket.
type idRecord struct {
	cost, remaining, granted int64
	settled                  *int64
}

// scanIDs reads request rows of storage s into a.ids.
func (a *attempt) scanIDs(s Storage) func(rowScanner) error {
	return func(rs rowScanner) error {
		var (
			k   idKey
			rec idRecord
		)
		for rs.Next() {
			k, rec = idKey{r: row{storage: s}}, idRecord{}
			if err := rs.Scan(&k.r.prefix, &k.r.key, &k.id, &rec.cost, &rec.remaining, &rec.granted, &rec.settled); err != nil {
				return err
			}
			a.ids[k] = &rec
		}
		return rs.Err()
	}
}

// readIDs returns the statements that read the request rows of a's requests
// with IDs, per table.
func (a *attempt) readIDs() []stmt {
	var stmts []stmt
	for s := range byStorage(a.rows) {
		var vals [][]any
		for _, q := range a.reqs {
			if q.id == "" {
				continue
			}
			for _, c := range q.charges {
				if c.row.storage == s {
					vals = append(vals, []any{c.row.prefix, c.row.key, q.id})
				}
			}
		}
		if len(vals) > 0 {
			stmts = append(stmts, a.shape.values(requestSQL.read, vals, a.scanIDs(s))...)
		}
	}
	return stmts
}

// decide decides q on what a holds: a settlement by its request's record,
// a check whose request ID was charged by the outcome it got then, anything
// else by the buckets. It notes what the decision writes besides the
// buckets: request rows, grants, ledger rows.
func (a *attempt) decide(q *request) {
	switch {
	case q.op == opSettle:
		a.settle(q)
	case q.id != "" && a.replay(q):
		return // charged before: nothing to write
	default:
		q.decide(a.stored, a.grants, a.now)
	}
	if q.err != nil || !q.out.Allowed {
		return
	}
	if q.id != "" && (q.op == opTake || q.op == opDebit) {
		a.remember(q)
	}
	switch q.op {
	case opGrant:
		a.extra = append(a.extra, a.grantStmt(q))
	case opReset:
		r := q.charges[0].row
		a.extra = append(a.extra, stmt{sql: r.storage.statements().remove, args: []any{r.prefix, r.key}})
	}
	a.ledgerRows(q)
}

// replay gives q the outcome of the first allowed check with its ID, if
// every bucket of q remembers one.
func (a *attempt) replay(q *request) bool {
	results := make([]Result, len(q.charges))
	for i, c := range q.charges {
		rec, ok := a.ids[idKey{c.row, q.id}]
		if !ok {
			return false
		}
		b := c.policy.load(a.stored[c.row], a.now)
		results[i] = Result{Allowed: true, Limit: c.policy.capacity, Remaining: rec.remaining, Granted: rec.granted,
			ResetAfter: c.policy.result(b, a.now, 0, true).ResetAfter}
	}
	q.out = MultiResult{Allowed: true, Results: results}
	if q.of != nil {
		q.out.Results = make([]Result, len(q.of))
		for i, j := range q.of {
			q.out.Results[i] = results[j]
		}
	}
	return true
}

// remember records q's outcome under its ID, for each of its buckets: in a
// (a later request of the same transaction with the ID replays it) and as
// rows to insert.
func (a *attempt) remember(q *request) {
	for i, c := range q.charges {
		r := q.out.Results[i]
		if q.of != nil {
			for k, j := range q.of {
				if j == i {
					r = q.out.Results[k]
					break
				}
			}
		}
		a.ids[idKey{c.row, q.id}] = &idRecord{cost: c.cost, remaining: r.Remaining, granted: r.Granted}
		retention := c.retention
		a.idRows = append(a.idRows, []any{c.row.prefix, c.row.key, q.id, c.cost, r.Remaining, r.Granted, a.now, a.now.Add(retention)})
	}
}

// settle brings the charge of q's request ID on its one bucket to q.actual:
// the difference back (as a refund, capped at Capacity) or taken beyond the
// estimate (as a debit, also below zero). A request settled before changes
// nothing.
func (a *attempt) settle(q *request) {
	c := q.charges[0]
	rec, ok := a.ids[idKey{c.row, q.id}]
	if !ok {
		q.err = fmt.Errorf("%w: request %q on %s of prefix %q", ErrUnknownRequest, q.id, quoteKey(c.row.key), c.row.prefix)
		return
	}
	diff := int64(0)
	if rec.settled == nil {
		diff = q.actual - rec.cost // within int64: both are >= 0
		actual := q.actual
		rec.settled = &actual
		a.extra = append(a.extra, stmt{sql: requestSQL.settle, args: []any{c.row.prefix, c.row.key, q.id, q.actual}})
	}
	sub := &request{ctx: q.ctx, charges: []charge{c}, op: opGive}
	switch {
	case diff > 0:
		sub.op, sub.charges[0].cost = opDebit, diff
	case diff < 0:
		sub.charges[0].cost = -diff
	default:
		sub.op, sub.charges[0].cost = opGive, 0
	}
	sub.decide(a.stored, a.grants, a.now)
	q.out, q.gained = sub.out, -diff
}

// ledgerRows notes the ledger rows of q, allowed, for its charges of
// limiters with Config.Ledger: what each balance gained, and the balance
// (tokens plus live grants) afterwards.
func (a *attempt) ledgerRows(q *request) {
	for i, c := range q.charges {
		if !c.ledger {
			continue
		}
		r := q.out.Results[i]
		if q.of != nil {
			for k, j := range q.of {
				if j == i {
					r = q.out.Results[k]
					break
				}
			}
		}
		var amount int64
		switch q.op {
		case opTake, opDebit:
			amount = -c.cost
		case opGive:
			amount = r.Remaining - c.policy.load(a.orig[c.row], a.now).tokens // capped at Capacity
		case opGrant:
			amount = c.cost
		case opSettle:
			amount = q.gained
		case opReset:
			amount = r.Remaining - c.policy.load(a.orig[c.row], a.now).tokens
		}
		if amount == 0 && q.op != opTake {
			continue
		}
		a.ledger = append(a.ledger, []any{c.row.prefix, c.row.key, a.now, amount, q.op.ledgerKind(), q.id, addSat(r.Remaining, r.Granted)})
	}
}

// grantStmt is the INSERT of q's grant, which reads back its ID.
func (a *attempt) grantStmt(q *request) stmt {
	c := q.charges[0]
	var exp any // NULL: never
	if !q.expires.IsZero() {
		exp = q.expires.UTC().Format(time.RFC3339Nano)
	}
	q.grant = Grant{Amount: c.cost, ExpiresAt: q.expires}
	return stmt{sql: grantSQL.add, args: []any{c.row.prefix, c.row.key, c.cost, exp}, scan: func(rs rowScanner) error {
		for rs.Next() {
			if err := rs.Scan(&q.grant.ID, &q.grant.GrantedAt); err != nil {
				return err
			}
		}
		return rs.Err()
	}}
}

package pgratelimit

import (
	"context"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/engine"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Settling costs known only afterwards, debits, and the ledger.

// Settle brings the charge of the check with request ID requestID on key to
// its actual cost, once the work is done: an LLM call's tokens, the bytes a
// download really served. Take an estimate up front with AllowN in a
// WithRequestID context, then settle. When actual is above the estimate the
// rest is taken as Debit takes it: from the bucket's tokens, then the live
// grants, then as a debt (the work is done, so it is owed; checks are denied
// until the balance covers them). When actual is below, the difference goes
// back where the estimate took it from: to the grants it spent first (the
// last spent first, each up to what was taken from it, and only while it is
// live: credits given back to a grant that has expired since expire with
// it), then to the bucket, up to Capacity. Settling a request again at the
// same actual cost changes nothing and returns the first settlement's
// Result; at another, ErrRequestMismatch. actual must be >= 0
// (ErrInvalidCost); a request the database does not remember (never
// allowed, or past Config.RequestIDRetention) is ErrUnknownRequest. The
// Result reports the key afterwards (Remaining is negative while it owes).
func (l *Limiter) Settle(ctx context.Context, key, requestID string, actual int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if actual < 0 {
		return Result{}, badArg(ErrInvalidCost, "actual cost %d is below 0", actual)
	}
	if _, err := checkRequestID(requestID); err != nil {
		return Result{}, err
	}
	q, err := l.changeRequest(WithRequestID(ctx, requestID), account.OpSettle, key, 0)
	if err != nil {
		return Result{}, err
	}
	q.Actual = actual
	if err := l.run(q, l.settings(), false, "settle "+quoteKey(key)); err != nil {
		return Result{}, err
	}
	return decidedResult(q.Outcomes[0]), nil
}

// Debit takes n from key whatever it holds: from the bucket's tokens first,
// then from the live grants, and the rest as a debt (the bucket below zero):
// a cost that had no estimate, for work already done. A debt is repaid by
// the first credits that arrive: refills as they fall, a grant at once, a
// refund; checks are denied until the balance (tokens plus grants) covers
// them. With a WithRequestID context it is taken once per ID, as a check is.
// n must be >= 1 (ErrInvalidCost).
func (l *Limiter) Debit(ctx context.Context, key string, n int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if n < 1 {
		return Result{}, badArg(ErrInvalidCost, "debit %d is below 1", n)
	}
	return l.change(ctx, account.OpDebit, key, n, "debit "+quoteKey(key))
}

// LedgerEntry is a row of the ledger (Config.Ledger).
type LedgerEntry struct {
	// ID orders the entries of a key.
	ID int64
	// At is when it happened, by the check's clock (the database's, or
	// Config.Clock): the time of the transaction that wrote it.
	At time.Time
	// Amount is what the key's balance (tokens plus live grants) gained:
	// negative for a charge or a debit, positive for a refund or a grant; a
	// settlement's is what the balance gained by it (estimate minus actual
	// cost, less any part a cap or an expired grant kept); a reset's the
	// tokens it restored; an expiry's the credits its grant still held; a
	// plan change's what it added or clamped.
	Amount int64
	// GrantsAmount is the part of Amount that went to or came from grants;
	// the rest (Amount - GrantsAmount) is the bucket's.
	GrantsAmount int64
	// Kind is "charge", "debit", "refund", "grant", "settle", "reset",
	// "expire" or "plan".
	Kind string
	// RequestID is the request ID of the operation, if it had one.
	RequestID string
	// Balance is the key's balance afterwards: the bucket's tokens plus its
	// live grants. Each entry's Balance is the previous one's plus its
	// Amount, plus the refills that fell between them (the ledger records
	// operations, not refills).
	Balance int64
	// Granted is the part of Balance in live grants.
	Granted int64
}

// Ledger returns key's ledger entries since since (all of them for the zero
// time), oldest first.
func (l *Limiter) Ledger(ctx context.Context, key string, since time.Time) ([]LedgerEntry, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	var rows []engine.LedgerRow
	if err := l.client.read(ctx, l.tx, "read the ledger of "+quoteKey(key), engine.ReadLedger(l.row(key), since, &rows)); err != nil {
		return nil, err
	}
	es := make([]LedgerEntry, len(rows))
	for i, r := range rows {
		es[i] = LedgerEntry(r)
	}
	return es, nil
}

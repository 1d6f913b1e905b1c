package pgratelimit

import (
	"context"
	"fmt"
	"time"
)

// Settling costs known only afterwards, debits, and the ledger.

// Settle brings the charge of the check with request ID requestID on key to
// its actual cost, once the work is done: an LLM call's tokens, the bytes a
// download really served. Take an estimate up front with AllowN in a
// WithRequestID context, then settle: when actual is below the estimate the
// difference goes back to the bucket (capped at Capacity, as a refund);
// when above, the rest is taken even if that takes the bucket below zero
// (the work is done, so it is owed: a debt that later refills or grants
// repay, while checks are denied until the balance covers them). Settling a
// request again changes nothing: it returns the bucket as it is. actual
// must be >= 0 (ErrInvalidCost); a request the database does not remember
// (never allowed, or forgotten after Config.RequestIDRetention) is
// ErrUnknownRequest. The Result reports the bucket afterwards (Remaining is
// negative while the key owes).
func (l *Limiter) Settle(ctx context.Context, key, requestID string, actual int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if actual < 0 {
		return Result{}, fmt.Errorf("%w: actual cost %d is below 0", ErrInvalidCost, actual)
	}
	q, err := l.changeRequest(WithRequestID(ctx, requestID), opSettle, key, 0)
	if err != nil {
		return Result{}, err
	}
	q.actual = actual
	m, err := l.client.run(q, l, false, "settle "+quoteKey(key))
	if err != nil {
		return Result{}, err
	}
	return m.Results[0], nil
}

// Debit takes n tokens from key's bucket whatever it holds, also below zero:
// a cost that had no estimate, for work already done (see Settle for what a
// debt means). With a WithRequestID context it is taken once per ID, as a
// check is. n must be >= 1 (ErrInvalidCost).
func (l *Limiter) Debit(ctx context.Context, key string, n int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if n < 1 {
		return Result{}, fmt.Errorf("%w: debit %d is below 1", ErrInvalidCost, n)
	}
	return l.change(ctx, opDebit, key, n, "debit "+quoteKey(key))
}

// LedgerEntry is a row of the ledger (Config.Ledger).
type LedgerEntry struct {
	// ID orders the entries of a key.
	ID int64
	// At is when it happened, by the database's clock (or Config.Clock).
	At time.Time
	// Amount is what the key's balance gained: negative for a charge or a
	// debit, positive for a refund or a grant; a settlement's is the
	// estimate minus the actual cost; a reset's the tokens it restored.
	Amount int64
	// Kind is "charge", "refund", "grant", "settle", "debit" or "reset".
	Kind string
	// RequestID is the request ID of the check, if it had one.
	RequestID string
	// Balance is the key's balance afterwards: the bucket's tokens plus its
	// live grants.
	Balance int64
}

// Ledger returns key's ledger entries since since (all of them for the zero
// time), oldest first.
func (l *Limiter) Ledger(ctx context.Context, key string, since time.Time) ([]LedgerEntry, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if !l.client.gate.enter() {
		return nil, ErrClosed
	}
	defer l.client.gate.leave()
	what := "read the ledger of " + quoteKey(key)
	rows, err := l.client.pool.Query(ctx, ledgerSQL.list, l.cfg.Prefix, key, since.UTC().Format(time.RFC3339Nano))
	if err != nil {
		return nil, dbError(what, err)
	}
	defer rows.Close()
	var es []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		if err := rows.Scan(&e.ID, &e.At, &e.Amount, &e.Kind, &e.RequestID, &e.Balance); err != nil {
			return nil, dbError(what, err)
		}
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError(what, err)
	}
	return es, nil
}

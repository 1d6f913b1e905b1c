package pgratelimit

import (
	"context"
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Grants: credits added to a key beyond its bucket, in any amount, with an
// optional expiry (a purchased pack that never expires, a promotion that
// ends on a date). The checks of a limiter with Config.Grants take from the
// bucket first, then from the key's live grants, soonest-expiring first; a
// denied check takes from neither. Each grant is a row of its own in
// pgratelimit_grants, read and locked in the check's transaction right after
// the bucket's row, in the same round trip.

// InfDuration is the RetryAfter of a check that refills alone can never
// allow: its cost is above the bucket's Capacity plus the key's grants that
// are still live then.
const InfDuration = account.Inf

// Grant is a grant of credits to a key.
type Grant struct {
	// ID identifies the grant among its key's.
	ID int64
	// Amount is what is left of it: for a new grant, the amount granted
	// less the key's debt it repaid at once.
	Amount int64
	// ExpiresAt is when it expires, the first instant it is no longer
	// spent; the zero time: never.
	ExpiresAt time.Time
	// GrantedAt is when it was granted, by the check's clock.
	GrantedAt time.Time
}

func grantOf(g account.Grant) Grant {
	return Grant{ID: g.ID, Amount: g.Amount, ExpiresAt: g.ExpiresAt, GrantedAt: g.GrantedAt}
}

// Grant adds amount credits to key beyond its bucket, spent by the checks of
// limiters with Config.Grants on this limiter's Prefix after the bucket's
// tokens, soonest-expiring grant first (equal expiries in the order
// granted). A key in debt (Settle, Debit) repays it from the grant at once.
// expiresAt is when the grant expires, by the check's clock (the database's,
// or Config.Clock): the grant is spent before that instant, not at it; the
// zero time means never; an expiry not after the check's clock is
// ErrGrantExpired. amount must be >= 1 (ErrInvalidCost); the limiter must
// have Config.Grants (ErrInvalidConfig), since no other would spend it. With
// a WithRequestID context the grant is made once per ID (a retry returns the
// same Grant).
func (l *Limiter) Grant(ctx context.Context, key string, amount int64, expiresAt time.Time) (Grant, error) {
	q, err := l.grantRequest(ctx, key, amount, expiresAt)
	if err != nil {
		return Grant{}, err
	}
	if err := l.run(q, l.settings(), false, "grant to "+quoteKey(key)); err != nil {
		return Grant{}, err
	}
	return grantOf(q.Grant), nil
}

// grantRequest is the request of a grant, checked.
func (l *Limiter) grantRequest(ctx context.Context, key string, amount int64, expiresAt time.Time) (*engine.Request, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if !l.cfg.Grants {
		return nil, badArg(ErrInvalidArgument, "Grant on prefix %q, whose limiter has Config.Grants off: its checks would never spend it", l.cfg.Prefix)
	}
	if amount < 1 {
		return nil, badArg(ErrInvalidCost, "grant %d is below 1", amount)
	}
	if expiresAt.After(account.MaxTime) {
		return nil, badArg(ErrInvalidArgument, "grant expiry %s is out of range", expiresAt.Format(time.RFC3339))
	}
	q, err := l.changeRequest(ctx, account.OpGrant, key, amount)
	if err != nil {
		return nil, err
	}
	q.Expires = expiresAt.Truncate(time.Microsecond)
	return q, nil
}

// Grants returns key's live grants (credits left, not expired), in the
// order they are spent: soonest-expiring first, never-expiring last, equal
// expiries in the order granted.
func (l *Limiter) Grants(ctx context.Context, key string) ([]Grant, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	st, now, err := l.load(ctx, key, "list the grants of "+quoteKey(key), func(st *account.State, now *time.Time) []engine.Stmt {
		return engine.ReadGrants(l.row(key), l.clock.Param(), st, now)
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(st.Grants, account.CompareGrants)
	var out []Grant
	for _, g := range st.Grants {
		if g.Live(now) {
			out = append(out, grantOf(g))
		}
	}
	return out, nil
}

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
	if m := l.client.mem; m != nil && l.tx == nil {
		rows = m.Ledger(l.row(key), since)
	} else if err := l.client.read(ctx, l.tx, "read the ledger of "+quoteKey(key), engine.ReadLedger(l.row(key), since, &rows)); err != nil {
		return nil, err
	}
	es := make([]LedgerEntry, len(rows))
	for i, r := range rows {
		es[i] = LedgerEntry(r)
	}
	return es, nil
}

// Request IDs (idempotency keys): an allowed charge, debit, refund or grant
// that carries one leaves a row in pgratelimit_requests, per bucket, in its
// own transaction, with what it did and the outcome it got. A later request
// with the same ID on the same bucket finds that row (read in the statements
// that lock the buckets, so in the same round trip) and returns that outcome
// without doing anything again, or ErrRequestMismatch if it asks for
// something else. Every writer of a bucket's request rows holds the bucket's
// row lock, so two requests with one ID cannot both apply: the second waits
// for the first, then reads its row.

type requestIDKey struct{}

// WithRequestID returns a copy of ctx whose operations carry the request ID
// id: an idempotency key that makes a retry safe. The first allowed charge
// (AllowN, AllowAll, Wait), Debit, Refund or Grant with id on a bucket
// applies and the database remembers what it did and its outcome (for
// Config.RequestIDRetention); a later one with the same id on the same
// bucket (a retry after a lost reply, a timeout, a crash) returns that
// outcome and changes nothing, whichever process sends it, also when both
// run at once; one that asks for something else (another cost, another
// operation) is ErrRequestMismatch. A denied check records nothing, so its
// retry is decided afresh; in the caller's transaction (In) the ID is
// used only if that transaction commits. AllowAll with such a context
// records the ID for each of its buckets: one ID names one call, with the
// same charges. Settle names the charge it settles by its ID; Reset ignores
// the ID (the ledger row carries it).
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestID returns ctx's request ID (WithRequestID), checked, or "".
func requestID(ctx context.Context) (string, error) {
	id, ok := ctx.Value(requestIDKey{}).(string)
	if !ok {
		return "", nil
	}
	return checkRequestID(id)
}

func checkRequestID(id string) (string, error) {
	if why := checkText(id, maxRequestIDLen); why != "" {
		return "", badArg(ErrInvalidRequestID, "%s", why)
	}
	return id, nil
}

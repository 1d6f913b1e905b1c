package pgratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/engine"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

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

// RequestRecord is what the database remembers of a request ID on a key
// (WithRequestID): the operation it named and the outcome it got.
type RequestRecord struct {
	// Kind is what it did: "charge" (AllowN, AllowAll, Wait), "debit",
	// "refund" or "grant".
	Kind string
	// Amount is the cost, debit, refund or grant it asked for.
	Amount int64
	// Result is its first outcome, which a retry returns.
	Result Result
	// Grant is the grant it made (Kind "grant").
	Grant Grant
	// Settled says it was settled (Settle), at Actual, with Settlement as
	// the settlement's outcome.
	Settled    bool
	Actual     int64
	Settlement Result
	// At is when it happened, by the check's clock; ExpiresAt when it is
	// forgotten (Config.RequestIDRetention later): from then on the ID
	// names a new request.
	At, ExpiresAt time.Time
}

// LookupRequest returns what the database remembers of requestID on key's
// bucket: the operation it named and its first outcome, its settlement, or
// ErrUnknownRequest if it remembers none (never allowed, or past its
// retention). It reads and writes nothing else.
func (l *Limiter) LookupRequest(ctx context.Context, key, requestID string) (RequestRecord, error) {
	if err := validateKey(key); err != nil {
		return RequestRecord{}, err
	}
	if _, err := checkRequestID(requestID); err != nil {
		return RequestRecord{}, err
	}
	var (
		rec   account.Record
		found bool
		now   time.Time
	)
	what := "look up request " + strconv.Quote(requestID) + " of " + quoteKey(key)
	if err := l.client.read(ctx, l.tx, what, engine.ReadRecord(l.row(key), requestID, l.clock.Param(), l.p.Capacity, &rec, &found, &now)...); err != nil {
		return RequestRecord{}, err
	}
	if !found || !rec.Live(now) {
		return RequestRecord{}, fmt.Errorf("%w: request %q on %s of prefix %q", ErrUnknownRequest, requestID, quoteKey(key), l.cfg.Prefix)
	}
	return RequestRecord{Kind: rec.Kind.String(), Amount: rec.Amount, Result: resultOf(rec.Outcome),
		Grant: grantOf(rec.Grant), Settled: rec.Settled, Actual: rec.Actual, Settlement: resultOf(rec.Settlement),
		At: rec.CreatedAt, ExpiresAt: rec.ExpiresAt}, nil
}

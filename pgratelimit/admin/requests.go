package admin

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Request is what the database remembers of a request ID on a key
// (pgratelimit.WithRequestID): the operation it named and the outcome it
// got, which a retry with the ID returns.
type Request struct {
	Prefix, Key string
	// ID is the request ID.
	ID string
	// Kind is what it did: "charge" (AllowN, AllowAll, Wait), "debit",
	// "refund" or "grant".
	Kind string
	// Amount is the cost, debit, refund or grant it asked for.
	Amount int64
	// Result is its first outcome, which a retry returns (Replayed aside).
	Result pgratelimit.Result
	// Grant is the grant it made (Kind "grant").
	Grant pgratelimit.Grant
	// Settled says it was settled (Limiter.Settle), at Actual, with
	// Settlement as the settlement's outcome.
	Settled    bool
	Actual     int64
	Settlement pgratelimit.Result
	// At is when it happened, by the check's clock. ExpiresAt is when it
	// is forgotten (Config.RequestIDRetention after At): from then on the
	// ID names a new request. A forgotten request is still listed until
	// cleanup deletes its row.
	At, ExpiresAt time.Time
}

// RequestFilter selects the requests of one key for Requests.
type RequestFilter struct {
	// Prefix and Key name the key (Config.Prefix, the key checked).
	// Required.
	Prefix, Key string
	// AfterID selects the requests after it, in ID order (bytewise): to
	// page, pass the last ID seen. Defaults to "": from the first.
	AfterID string
	// Limit is the most requests returned, at most 10000. Defaults to 100.
	Limit int
}

// Requests returns the request IDs the database remembers on the key f
// names, in ID order, up to f.Limit, and changes nothing.
func Requests(ctx context.Context, pool *pgxpool.Pool, f RequestFilter) ([]Request, error) {
	if err := checkKey(pool, f.Prefix, f.Key); err != nil {
		return nil, err
	}
	if f.Limit < 0 || f.Limit > maxLimit {
		return nil, fmt.Errorf("%w: RequestFilter.Limit must be in [0, %d], got %d", pgratelimit.ErrInvalidArgument, maxLimit, f.Limit)
	}
	if why := engine.CheckText(f.AfterID, engine.MaxRequestIDLen); f.AfterID != "" && why != "" {
		return nil, fmt.Errorf("%w: %w: RequestFilter.AfterID %s", pgratelimit.ErrInvalidArgument, pgratelimit.ErrInvalidRequestID, why)
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	return readRequests(ctx, pool, "list the requests of "+strconv.Quote(f.Key), sqlgen.Requests.List, f.Prefix, f.Key, f.AfterID, limit)
}

// LookupRequest returns what the database remembers of request id on key
// of prefix, or an error matching pgratelimit.ErrUnknownRequest if it
// remembers nothing (never allowed, or deleted by cleanup after it was
// forgotten).
func LookupRequest(ctx context.Context, pool *pgxpool.Pool, prefix, key, id string) (Request, error) {
	if err := checkKey(pool, prefix, key); err != nil {
		return Request{}, err
	}
	if why := engine.CheckText(id, engine.MaxRequestIDLen); why != "" {
		return Request{}, fmt.Errorf("%w: %w: request ID %s", pgratelimit.ErrInvalidArgument, pgratelimit.ErrInvalidRequestID, why)
	}
	rs, err := readRequests(ctx, pool, "look up request "+strconv.Quote(id), sqlgen.Requests.Get, prefix, key, id)
	if err != nil {
		return Request{}, err
	}
	if len(rs) == 0 {
		return Request{}, fmt.Errorf("%w: request %q on key %q of prefix %q", pgratelimit.ErrUnknownRequest, id, key, prefix)
	}
	return rs[0], nil
}

// checkKey checks the pool, prefix and key every read of a key's requests
// takes.
func checkKey(pool *pgxpool.Pool, prefix, key string) error {
	if pool == nil {
		return &pgratelimit.ConfigError{Field: "pool", Reason: "is nil"}
	}
	if why := engine.CheckText(prefix, engine.MaxPrefixLen); why != "" {
		return fmt.Errorf("%w: prefix %s", pgratelimit.ErrInvalidArgument, why)
	}
	if why := engine.CheckText(key, engine.MaxKeyLen); why != "" {
		return fmt.Errorf("%w: %w: key %s", pgratelimit.ErrInvalidArgument, pgratelimit.ErrInvalidKey, why)
	}
	return nil
}

// readRequests runs a read of request rows and converts them.
func readRequests(ctx context.Context, pool *pgxpool.Pool, what, sql string, args ...any) ([]Request, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, engine.DBError(what, err)
	}
	defer rows.Close()
	var out []Request
	for rows.Next() {
		var q Request
		rec, err := engine.ScanRecord(rows, []any{&q.Prefix, &q.Key, &q.ID}, 0)
		if err != nil {
			return nil, engine.DBError(what, err)
		}
		q.Kind, q.Amount, q.Settled, q.Actual = rec.Kind.String(), rec.Amount, rec.Settled, rec.Actual
		q.Result, q.Settlement = resultOf(rec.Outcome), resultOf(rec.Settlement)
		q.Grant = pgratelimit.Grant{ID: rec.Grant.ID, Amount: rec.Grant.Amount, ExpiresAt: rec.Grant.ExpiresAt, GrantedAt: rec.Grant.GrantedAt}
		q.At, q.ExpiresAt = rec.CreatedAt, rec.ExpiresAt
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, engine.DBError(what, err)
	}
	return out, nil
}

// resultOf is the Result a request's outcome was.
func resultOf(o account.Outcome) pgratelimit.Result {
	return pgratelimit.Result{Allowed: o.Allowed, Limit: o.Limit, Remaining: o.Remaining, RetryAfter: o.RetryAfter,
		ResetAfter: o.ResetAfter, Granted: o.Granted, FromGrants: o.FromGrants}
}

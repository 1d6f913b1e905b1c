package pgratelimit

import (
	"context"
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/engine"

	"github.com/pgratelimit/pgratelimit/internal/account"
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
	var (
		st  account.State
		now time.Time
	)
	if err := l.client.read(ctx, l.tx, "list the grants of "+quoteKey(key), engine.ReadGrants(l.row(key), l.clock.Param(), &st, &now)...); err != nil {
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

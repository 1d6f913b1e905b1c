package pgratelimit

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// Grants: credits added to a key beyond its bucket, in any amount, with an
// optional expiry (a purchased pack that never expires, a promotion that
// ends on a date). The checks of a limiter with Config.Grants take from the
// bucket first, then from the key's live grants, soonest-expiring first; a
// denied check takes from neither. Each grant is a row of its own in
// pgratelimit_grants (see GrantsTable), read and locked in the check's
// transaction right after the bucket's row, in the same round trip.

// InfDuration is the RetryAfter of a check that refills alone can never
// allow: its cost is above the bucket's Capacity plus the key's grants.
const InfDuration = time.Duration(math.MaxInt64)

// Grant is a grant of credits to a key.
type Grant struct {
	// ID identifies the grant among its key's.
	ID int64
	// Amount is what is left of it (as granted, for a new grant).
	Amount int64
	// ExpiresAt is when it expires; the zero time: never.
	ExpiresAt time.Time
	// GrantedAt is when it was granted, by the database's clock.
	GrantedAt time.Time
}

// grant is a grant as a check reads it.
type grant struct {
	id        int64
	amount    int64
	expiresAt time.Time // zero: never
}

// live says whether g can be spent at now.
func (g grant) live(now time.Time) bool {
	return g.amount > 0 && (g.expiresAt.IsZero() || now.Before(g.expiresAt))
}

// granted is the sum of gs's live amounts at now, saturating.
func granted(gs []grant, now time.Time) int64 {
	var sum int64
	for _, g := range gs {
		if g.live(now) {
			sum = addSat(sum, g.amount)
		}
	}
	return sum
}

// spend takes n from gs's live grants at now, in order (soonest-expiring
// first, as read), and returns the grants afterwards: gs itself is not
// changed. The caller has made sure they hold n.
func spend(gs []grant, now time.Time, n int64) []grant {
	out := make([]grant, len(gs))
	copy(out, gs)
	for i := range out {
		if n == 0 {
			break
		}
		if out[i].live(now) {
			take := min(out[i].amount, n)
			out[i].amount -= take
			n -= take
		}
	}
	return out
}

// takeWithGrants applies a check of cost to the loaded bucket b and the
// key's grants gs: from the bucket first, the rest from the grants. When the
// bucket and the live grants together hold less than cost, nothing is taken
// and the Result says when refills alone would make up the difference
// (assuming no grant expires meanwhile; InfDuration when they never can).
func (p policy) takeWithGrants(b bucket, gs []grant, now time.Time, cost int64) (bucket, []grant, Result) {
	g := granted(gs, now)
	if b.tokens >= cost {
		b, r := p.take(b, now, cost)
		r.Granted = g
		return b, gs, r
	}
	if b.tokens > math.MaxInt64-g || b.tokens+g < cost {
		r := p.result(b, now, cost, false)
		r.Granted = g
		if need := cost - g; need > p.capacity {
			r.RetryAfter = InfDuration
		} else {
			r.RetryAfter = p.untilTokens(b, now, need)
		}
		return b, gs, r
	}
	fromGrants := cost - b.tokens
	if b.tokens > 0 {
		b, _ = p.take(b, now, b.tokens)
	}
	r := p.result(b, now, cost, true)
	r.Granted = g - fromGrants
	return b, spend(gs, now, fromGrants), r
}

// Grant adds amount credits to key beyond its bucket, spent by the checks
// of limiters with Config.Grants on this limiter's Prefix after the
// bucket's tokens, soonest-expiring grant first. expiresAt is when the
// grant expires, by the database's clock (or Config.Clock); the zero time
// means never. amount must be >= 1 (ErrInvalidCost); the limiter must have
// Config.Grants (ErrInvalidConfig), since no other would spend it.
func (l *Limiter) Grant(ctx context.Context, key string, amount int64, expiresAt time.Time) (Grant, error) {
	q, err := l.grantRequest(ctx, key, amount, expiresAt)
	if err != nil {
		return Grant{}, err
	}
	if _, err := l.client.run(q, l, false, "grant to "+quoteKey(key)); err != nil {
		return Grant{}, err
	}
	return q.grant, nil
}

// GrantTx is Grant inside the caller's transaction tx: the grant exists
// only if tx commits, so a purchase and its credits commit together.
func (l *Limiter) GrantTx(ctx context.Context, tx pgx.Tx, key string, amount int64, expiresAt time.Time) (Grant, error) {
	return l.grantIn(ctx, pgxExecutor{tx}, key, amount, expiresAt)
}

// GrantSQLTx is GrantTx for a database/sql transaction, with any PostgreSQL
// driver.
func (l *Limiter) GrantSQLTx(ctx context.Context, tx *sql.Tx, key string, amount int64, expiresAt time.Time) (Grant, error) {
	if tx == nil {
		return Grant{}, fmt.Errorf("%w: tx is nil", ErrInvalidConfig)
	}
	return l.grantIn(ctx, sqlExecutor{tx}, key, amount, expiresAt)
}

func (l *Limiter) grantIn(ctx context.Context, ex executor, key string, amount int64, expiresAt time.Time) (Grant, error) {
	q, err := l.grantRequest(ctx, key, amount, expiresAt)
	if err != nil {
		return Grant{}, err
	}
	if err := l.runIn(ctx, ex, q, "grant to "+quoteKey(key)+" in transaction"); err != nil {
		return Grant{}, err
	}
	return q.grant, nil
}

// grantRequest is the request of a grant, checked.
func (l *Limiter) grantRequest(ctx context.Context, key string, amount int64, expiresAt time.Time) (*request, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if !l.cfg.Grants {
		return nil, fmt.Errorf("%w: Grant on prefix %q, whose limiter has Config.Grants off: its checks would never spend it", ErrInvalidConfig, l.cfg.Prefix)
	}
	if amount < 1 {
		return nil, fmt.Errorf("%w: grant %d is below 1", ErrInvalidCost, amount)
	}
	q, err := l.changeRequest(ctx, opGrant, key, amount)
	if err != nil {
		return nil, err
	}
	q.expires = expiresAt
	return q, nil
}

// Grants returns key's live grants (not spent, not expired), soonest-expiring
// first.
func (l *Limiter) Grants(ctx context.Context, key string) ([]Grant, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if !l.client.gate.enter() {
		return nil, ErrClosed
	}
	defer l.client.gate.leave()
	rows, err := l.client.pool.Query(ctx, grantSQL.list, l.cfg.Prefix, key, l.clock.param())
	if err != nil {
		return nil, dbError("list the grants of "+quoteKey(key), err)
	}
	var gs []Grant
	for rows.Next() {
		var g Grant
		var exp *time.Time
		if err := rows.Scan(&g.ID, &g.Amount, &exp, &g.GrantedAt); err != nil {
			rows.Close()
			return nil, dbError("list the grants of "+quoteKey(key), err)
		}
		if exp != nil {
			g.ExpiresAt = *exp
		}
		gs = append(gs, g)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError("list the grants of "+quoteKey(key), err)
	}
	return gs, nil
}

// compareGrants orders grants as they are spent: soonest-expiring first,
// never-expiring last, then as granted.
func compareGrants(a, b grant) int {
	switch {
	case a.expiresAt.IsZero() != b.expiresAt.IsZero():
		if a.expiresAt.IsZero() {
			return 1
		}
		return -1
	case !a.expiresAt.Equal(b.expiresAt):
		return a.expiresAt.Compare(b.expiresAt)
	}
	return cmp.Compare(a.id, b.id)
}

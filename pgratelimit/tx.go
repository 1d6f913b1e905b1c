package pgratelimit

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// AllowNTx is AllowN inside the caller's transaction tx: the tokens are spent
// only if tx commits, so a service can charge credits atomically with its own
// write (and a rollback gives them back).
//
// The bucket's row stays locked until tx ends, so other checks of the same key
// wait for it: keep such transactions short. Under REPEATABLE READ or
// SERIALIZABLE a concurrent check of the same key makes this one fail with a
// serialization error (SQLSTATE 40001); retry the transaction as for any
// other. On an error the transaction is in a failed state: roll it back.
func (l *Limiter) AllowNTx(ctx context.Context, tx pgx.Tx, key string, cost int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if err := l.p.validateCost(cost); err != nil {
		return Result{}, err
	}
	res, err := l.check(ctx, tx, key, false, cost, l.takeOp(cost))
	if err != nil {
		return Result{}, dbError("check "+quoteKey(key)+" in transaction", err)
	}
	return res, nil
}

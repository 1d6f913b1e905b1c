package pgratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Wait is WaitN with cost 1.
func (l *Limiter) Wait(ctx context.Context, key string) (Result, error) {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until a check of cost is allowed, and returns its Result.
// Between tries it sleeps the denied check's RetryAfter plus a little jitter
// (other waiters on the same key may take the tokens first, so it can take
// more than one try).
//
// When the wait a denied check reports would pass ctx's deadline, or
// Config.MaxWait since WaitN was called, WaitN returns at once with
// ErrWaitTooLong and the denied Result. When ctx ends while it sleeps, it
// returns promptly with ctx's error. Errors of AllowN are returned as they
// are.
func (l *Limiter) WaitN(ctx context.Context, key string, cost int64) (Result, error) {
	start := time.Now()
	for {
		r, err := l.AllowN(ctx, key, cost)
		if err != nil || r.Allowed {
			return r, err
		}
		wake := time.Now().Add(r.RetryAfter)
		if dl, ok := ctx.Deadline(); ok && wake.After(dl) {
			return r, fmt.Errorf("%w: %s needed, context deadline in %s", ErrWaitTooLong, r.RetryAfter, time.Until(dl).Round(time.Millisecond))
		}
		if l.cfg.MaxWait > 0 && wake.Sub(start) > l.cfg.MaxWait {
			return r, fmt.Errorf("%w: %s needed, Config.MaxWait is %s", ErrWaitTooLong, wake.Sub(start).Round(time.Millisecond), l.cfg.MaxWait)
		}
		var slack []time.Duration
		if dl, ok := ctx.Deadline(); ok {
			slack = append(slack, dl.Sub(wake))
		}
		if l.cfg.MaxWait > 0 {
			slack = append(slack, l.cfg.MaxWait-wake.Sub(start))
		}
		sleep := r.RetryAfter + time.Duration(rand.Int64N(int64(maxJitter(r.RetryAfter, slack...))+1))
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, ctx.Err()
		case <-t.C:
		}
	}
}

// maxJitter is the most a retry after a wait may be delayed: up to a tenth
// of the wait, at most 50ms, so waiters woken by the same refill do not all
// retry at the same instant; never so much that the retry would come after
// the deadline or MaxWait (it gets at most a quarter of each slack, the
// time left after the wait).
func maxJitter(wait time.Duration, slack ...time.Duration) time.Duration {
	j := min(wait/10, 50*time.Millisecond)
	for _, s := range slack {
		j = min(j, s/4)
	}
	return max(j, 0)
}

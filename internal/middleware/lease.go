package middleware

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// hold returns the release func of d, the decision about r: for a request
// that goes on holding a lease (Allow, or Pass in shadow mode when the
// check acquired one), a func that stops the lease's heartbeat and releases
// it; else one that does nothing.
func (c *Core[R]) hold(ctx context.Context, r R, d Decision) func() {
	sem := c.cfg.Semaphore
	if sem == nil || !d.Result.Allowed || len(d.Result.Leases) == 0 {
		return nothing
	}
	l := d.Result.Leases[len(d.Result.Leases)-1]
	if l.ID == "" || d.Verdict != Allow && d.Verdict != Pass {
		return nothing
	}
	stop := make(chan struct{})
	// The lease outlives the request's context by as long as it takes to
	// release it: its own context, with the request's values.
	bg := context.WithoutCancel(ctx)
	go c.heartbeat(bg, r, sem, l, stop)
	return sync.OnceFunc(func() {
		close(stop)
		rctx, cancel := c.bound(bg)
		defer cancel()
		if err := sem.Release(rctx, l.Key, l.ID); err != nil {
			c.cfg.Logger.WarnContext(ctx, c.cfg.Name+": releasing the "+c.cfg.Noun+"'s lease failed", c.attrs(r, "key", l.Key, "lease", l.ID, "error", err)...)
		}
	})
}

// heartbeat extends lease l of sem every TTL/3 until stop is closed; it
// stops early when the lease is lost (expired or gone: the request runs on,
// without it, and that is logged).
func (c *Core[R]) heartbeat(ctx context.Context, r R, sem *pgratelimit.Semaphore, l pgratelimit.Lease, stop chan struct{}) {
	t := time.NewTicker(max(sem.Config().TTL/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ectx, cancel := c.bound(ctx)
		_, err := sem.Extend(ectx, l.Key, l.ID)
		cancel()
		select {
		case <-stop:
			return // released meanwhile: what Extend said no longer matters
		default:
		}
		if err != nil {
			lost := errors.Is(err, pgratelimit.ErrLeaseExpired) || errors.Is(err, pgratelimit.ErrLeaseNotFound)
			c.cfg.Logger.WarnContext(ctx, c.cfg.Name+": extending the "+c.cfg.Noun+"'s lease failed", c.attrs(r, "key", l.Key, "lease", l.ID, "lost", lost, "error", err)...)
			if lost {
				return
			}
		}
	}
}

// bound is ctx bounded by the check timeout (DefaultCheckTimeout when
// there is none).
func (c *Core[R]) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.cfg.CheckTimeout
	if d <= 0 {
		d = DefaultCheckTimeout
	}
	return context.WithTimeout(ctx, d)
}

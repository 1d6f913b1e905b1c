package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// releaseTimeout bounds a release, which runs past the run's end (a lease
// acquired just before it is released all the same).
const releaseTimeout = 10 * time.Second

// leaseAudit is a run's audit with --leases, a cheap one (the integration
// tests audit every holder's interval): every answer must agree with Max
// (an acquisition holds at most Max with its own units; a denial found too
// few free), and the units the run's workers hold of each key between an
// acquisition's answer and its release's request, a subset of what the
// database counts live, never pass Max.
type leaseAudit struct {
	max   int64
	held  []atomic.Int64
	first atomic.Pointer[string] // the first failure seen
}

func (a *leaseAudit) fail(format string, args ...any) {
	msg := "FAILED: " + fmt.Sprintf(format, args...)
	a.first.CompareAndSwap(nil, &msg)
}

// answer checks an acquisition's answer r for weight on key k.
func (a *leaseAudit) answer(k int, weight int64, r pgratelimit.LeaseResult) {
	switch {
	case r.Allowed && r.Limit-r.Remaining > a.max:
		a.fail("an acquisition of %s left %d units held, more than --lease-max %d", keyName(k), r.Limit-r.Remaining, a.max)
	case !r.Allowed && r.Limit-r.Remaining+weight <= a.max:
		a.fail("an acquisition of %s of %s was denied with %d of %d held", human.Plural(weight, "unit", "units"), keyName(k), r.Limit-r.Remaining, a.max)
	}
}

// hold notes weight more units of key k held, and an excess over max.
func (a *leaseAudit) hold(k int, weight int64) {
	if n := a.held[k].Add(weight); n > a.max {
		a.fail("%s had %d units held at once by the run's workers, more than --lease-max %d", keyName(k), n, a.max)
	}
}

func (a *leaseAudit) release(k int, weight int64) { a.held[k].Add(-weight) }

func (a *leaseAudit) verdict() string {
	if msg := a.first.Load(); msg != nil {
		return *msg
	}
	return "ok"
}

// leases makes the checker of a run with --leases: a check acquires a
// lease of cost units of its key and, when acquired, releases it at once
// (past the run's end, if need be); with --request-ids, a request ID per
// acquisition names its lease.
func (ch *checker) leases(client *pgratelimit.Client, o Options) error {
	s, err := client.NewSemaphore(o.SemaphoreConfig())
	if err != nil {
		return err
	}
	audit := &leaseAudit{max: o.LeaseMax, held: make([]atomic.Int64, o.Keys)}
	ch.audit = audit.verdict
	ch.check = func(ctx context.Context, k int, weight int64) (bool, error) {
		key := keyName(k)
		r, err := s.Acquire(ctx, key, weight)
		if err != nil {
			return false, err
		}
		if audit.answer(k, weight, r); !r.Allowed {
			return false, nil
		}
		audit.hold(k, weight)
		audit.release(k, weight) // before the release is sent: the database still counts it
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := s.Release(rctx, key, r.Lease.ID); err != nil {
			return false, fmt.Errorf("releasing lease %q of %s: %w", r.Lease.ID, key, err)
		}
		return true, nil
	}
	return nil
}

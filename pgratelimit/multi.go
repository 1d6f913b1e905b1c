package pgratelimit

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/lease"
)

// Charge is one bucket that AllowAll takes from, made by Limiter.Charge
// (cost tokens of the limiter's bucket for a key) or Semaphore.Charge (a
// lease of weight units of the semaphore's Max for a key). The zero Charge
// is ErrInvalidArgument.
type Charge struct {
	lim  *Limiter
	sem  *Semaphore
	key  string
	cost int64
}

// Charge is cost tokens of l's bucket for key, for AllowAll.
func (l *Limiter) Charge(key string, cost int64) Charge {
	return Charge{lim: l, key: key, cost: cost}
}

// Charge is a lease of weight units of s's Max for key, for AllowAll.
func (s *Semaphore) Charge(key string, weight int64) Charge {
	return Charge{sem: s, key: key, cost: weight}
}

// MultiResult is the outcome of AllowAll.
type MultiResult struct {
	// Allowed says that every charge took its tokens; when false, none did
	// and nothing was written.
	Allowed bool
	// Results holds one Result per charge, in the order given. Results[i]
	// describes charge i's bucket as AllowN would: Allowed says whether that
	// bucket alone had enough tokens (so the caller can tell which limit
	// said no), Remaining is the bucket after the decision (unchanged when
	// the call is denied), RetryAfter and ResetAfter as for AllowN. For a
	// lease charge, Limit is the semaphore's Max, Remaining its free units,
	// RetryAfter as LeaseResult's and ResetAfter the time until every live
	// lease of the key has expired.
	Results []Result
	// Leases holds, when the call is allowed, the lease each lease charge
	// acquired (the zero Lease for the charges of limiters); nil for a call
	// without lease charges.
	Leases []Lease
	// RetryAfter is, when denied, how long until every charge would be
	// allowed (the largest RetryAfter among Results); 0 when allowed.
	RetryAfter time.Duration
}

// AllowAll charges several buckets at once, all or nothing: every charge
// takes its cost from its bucket if each bucket holds enough, else none takes
// anything and nothing is written. "10 per second and 1000 per day" on one
// API key, or "the user's credits and the organization's" for one job, are
// two charges of one call.
//
// It is one transaction of the same shape as a single check over all the
// charges' rows, locked in one global order (table, prefix, key), so no two
// calls can deadlock whatever order their charges are listed in. Charges of
// the same bucket (same Storage, Prefix and key) add up; durable and
// ephemeral limiters can be charged together. The transaction takes the
// settings of all its limiters: the smallest LockTimeout any of them sets,
// AsyncCommit only if every one has it, and the database's clock unless a
// limiter has a Config.Clock (a test's: the first charge's that has one).
// It is coalesced with other checks of the first charge's Client unless a
// charged Limiter has DisableCoalescing.
//
// A charge with a Semaphore takes a lease of its key, all or nothing with
// the others ("one of 5 slots, one request of the per-minute rate and 1,000
// tokens of the monthly quota, or nothing"): MultiResult.Leases has it.
// With a WithRequestID context its ID is the lease's, as for Acquire.
// Charges of one semaphore's key add up to one lease.
//
// Every Limiter and Semaphore must use the same pool; otherwise, and for a
// charge with neither or both, or no charges, the error wraps
// ErrInvalidConfig. A bad key, a cost below 1, or a cost (summed per
// bucket) above that bucket's Capacity (of a limiter without Grants; a
// semaphore's Max) is
// ErrInvalidKey, ErrInvalidCost or ErrCostExceedsCapacity, before any
// database access.
func AllowAll(ctx context.Context, charges ...Charge) (MultiResult, error) {
	return allowAll(ctx, nil, charges)
}

// allowAll is AllowAll in tx (nil: in a transaction of the charges' own).
func allowAll(ctx context.Context, tx *Tx, charges []Charge) (MultiResult, error) {
	start := time.Now()
	cl, err := decideCall(ctx, tx, charges)
	var m MultiResult
	if err == nil {
		m = cl.result()
		cl.recordLeases(charges, m)
		cl.recycle()
	}
	record(ctx, start, m, err, charges)
	return m, err
}

// decideCall validates charges and decides them, in tx (nil: in a
// transaction of the charges' own).
func decideCall(ctx context.Context, tx *Tx, charges []Charge) (call, error) {
	cl, _, err := newCall(ctx, tx, charges)
	if err != nil {
		return call{}, err
	}
	return cl, cl.run(charges, tx)
}

// coalesces says whether every charged limiter and semaphore coalesces.
func coalesces(charges []Charge) bool {
	for _, c := range charges {
		if c.sem != nil && c.sem.cfg.DisableCoalescing || c.lim != nil && c.lim.cfg.DisableCoalescing {
			return false
		}
	}
	return true
}

// settings are the settings of c's limiter or semaphore.
func (c Charge) settings() engine.Settings {
	if c.sem != nil {
		return c.sem.settings()
	}
	return c.lim.settings()
}

// settingsOf are the settings of a transaction of charges: the smallest
// LockTimeout set, asynchronous commit only if every limiter has it (a
// semaphore has not), the first clock set.
func settingsOf(charges []Charge) engine.Settings {
	set := charges[0].settings()
	for _, c := range charges[1:] {
		o := c.settings()
		if o.LockTimeout > 0 && (set.LockTimeout == 0 || o.LockTimeout < set.LockTimeout) {
			set.LockTimeout = o.LockTimeout
		}
		set.Async = set.Async && o.Async
		if set.Clock == nil {
			set.Clock = o.Clock
		}
	}
	return set
}

// call is a request of a call, and which of its charges each Charge given
// was (charges of one bucket are merged).
type call struct {
	q     *engine.Request
	of    []int       // Charge i of the call is q.Charges[of[i]]; nil: one Charge
	lease *lease.Call // the call's lease charges' (nil: none)
	one   *oneCharge  // q's, for a call of one Charge (see recycle)
	from  *Client     // where one came from
}

// result is the outcome of a decided call, one Result per Charge given.
func (cl call) result() MultiResult {
	q := cl.q
	results := make([]Result, len(q.Outcomes))
	var retry time.Duration
	for i, o := range q.Outcomes {
		results[i] = decidedResult(o)
		retry = max(retry, results[i].RetryAfter)
	}
	m := MultiResult{Allowed: q.Allowed, Results: results}
	if !q.Allowed {
		m.RetryAfter = retry
	}
	if cl.lease != nil {
		m.Leases = cl.leases(results)
	}
	if cl.of != nil {
		m.Results = make([]Result, len(cl.of))
		ls := m.Leases
		if ls != nil {
			m.Leases = make([]Lease, len(cl.of))
		}
		for i, j := range cl.of {
			m.Results[i] = results[j]
			if ls != nil {
				m.Leases[i] = ls[j]
			}
		}
	}
	return m
}

// leases are the leases of q's charges (results[j] of q.Charges[j], fixed
// for the lease charges of a denied call).
func (cl call) leases(results []Result) []Lease {
	q := cl.q
	ls := make([]Lease, len(q.Charges))
	for j, c := range q.Charges {
		out, ok := cl.lease.Outcome(c.Row)
		switch {
		case c.Part == nil || !ok:
		case q.Allowed:
			ls[j] = leaseOf(c.Row.Key, out.Lease)
			results[j].Replayed = out.Replayed
		case results[j].Allowed && !out.Replayed:
			// This lease alone fitted, another charge did not: nothing
			// was taken.
			results[j].Remaining = min(results[j].Remaining+c.Cost, results[j].Limit)
		}
	}
	return ls
}

// recordLeases counts the lease charges' outcomes in their semaphores'
// metrics.
func (cl call) recordLeases(charges []Charge, m MultiResult) {
	for _, c := range charges {
		if c.sem == nil {
			continue
		}
		if out, ok := cl.lease.Outcome(c.sem.row(c.key)); ok {
			c.sem.rows.add(c.key)
			c.sem.metrics.record(cl.q.Ctx, c.key, m.Allowed, out)
		}
	}
}

// run runs cl's request in tx, else through charges[0]'s client.
func (cl call) run(charges []Charge, tx *Tx) error {
	set, co := settingsOf(charges), coalesces(charges)
	client, _ := charges[0].owner()
	for _, c := range charges {
		if c.lim != nil {
			c.lim.notePolicy(cl.q.Ctx, tx != nil)
		}
	}
	if tx != nil {
		return client.runIn(cl.q.Ctx, tx, cl.q, set, "check")
	}
	var seen func(context.Context, int)
	if l := charges[0].lim; l != nil {
		seen = l.metrics.seen
	}
	return client.run(cl.q, set, seen, co, "check")
}

// owner is the client and the caller's transaction (nil: none) of c's
// limiter or semaphore.
func (c Charge) owner() (*Client, *Tx) {
	if c.sem != nil {
		return c.sem.client, c.sem.tx
	}
	return c.lim.client, c.lim.tx
}

// newCall validates charges, before any database access, and merges the
// charges of each bucket. It returns the first charge's Limiter too (nil
// for a Semaphore's).
func newCall(ctx context.Context, tx *Tx, charges []Charge) (call, *Limiter, error) {
	if len(charges) == 0 {
		return call{}, nil, badArg(ErrInvalidArgument, "AllowAll needs at least one charge")
	}
	id, err := requestID(ctx)
	if err != nil {
		return call{}, nil, err
	}
	var cl call
	if c := charges[0]; len(charges) == 1 && (c.lim == nil) != (c.sem == nil) {
		// A check: its request and charge in one, recycled.
		cl.from, _ = c.owner()
		cl.one, _ = cl.from.ones.Get().(*oneCharge)
		if cl.one == nil {
			cl.one = new(oneCharge)
		}
		cl.q, cl.one.q.Charges = &cl.one.q, cl.one.c[:0]
	} else {
		cl.q = &engine.Request{Charges: make([]engine.Charge, 0, len(charges))}
		if len(charges) > 1 {
			cl.of = make([]int, len(charges))
		}
	}
	cl.q.Ctx, cl.q.Kind, cl.q.ID = ctx, account.OpCharge, id
	for i, c := range charges {
		if (c.lim == nil) == (c.sem == nil) {
			return call{}, nil, badArg(ErrInvalidArgument, "charge %d is not made by Limiter.Charge or Semaphore.Charge (of a non-nil limiter or semaphore)", i)
		}
		if err := c.same(i, charges[0], tx); err != nil {
			return call{}, nil, err
		}
		var err error
		if c.sem != nil {
			err = cl.addLease(i, c, charges[0])
		} else {
			err = cl.add(i, c, charges[0])
		}
		if err != nil {
			return call{}, nil, err
		}
	}
	return cl, charges[0].lim, nil
}

// oneCharge is a request of one charge, and that charge, in one
// allocation. It is recycled (Client.ones) once its call has returned
// without an error: then nothing else holds it (on an error, a coalesced
// batch may still be deciding it, its caller's context having ended).
type oneCharge struct {
	q engine.Request
	c [1]engine.Charge
}

// recycle puts cl's request back in its client's ones, if it came from
// there; cl is not used after.
func (cl call) recycle() {
	if cl.one != nil {
		*cl.one = oneCharge{}
		cl.from.ones.Put(cl.one)
	}
}

// same checks that charge i, c, runs where first does: on its pool, and in
// tx (nil: the charges' own transaction) unless bound to no transaction.
func (c Charge) same(i int, first Charge, tx *Tx) error {
	cc, ctx := c.owner()
	fc, _ := first.owner()
	switch {
	case cc.pool != fc.pool || cc.mem != fc.mem:
		return badArg(ErrInvalidArgument, "charge %d's Limiter or Semaphore uses another pool than charge 0's; AllowAll runs one transaction", i)
	case ctx != nil && tx == nil:
		return badArg(ErrInvalidArgument, "charge %d's Limiter or Semaphore is bound to a transaction (In); run AllowAll in a transaction with Tx.AllowAll", i)
	case ctx != nil && *ctx != *tx:
		return badArg(ErrInvalidArgument, "charge %d's Limiter or Semaphore is bound to another transaction (In) than the one AllowAll runs in", i)
	}
	return nil
}

// add adds charge i, c (of a limiter), to cl, checked.
func (cl *call) add(i int, c Charge, first Charge) error {
	l := c.lim
	if cl.q.ID != "" && l.cfg.AsyncCommit {
		return errAsyncID(l)
	}
	if err := validateKey(c.key); err != nil {
		return err
	}
	if err := l.validateCost(c.cost); err != nil {
		return err
	}
	q, r := cl.q, l.row(c.key)
	j := 0
	for j < len(q.Charges) && q.Charges[j].Row != r {
		j++
	}
	if j == len(q.Charges) {
		q.Charges = append(q.Charges, l.charge(c.key, 0))
	} else if q.Charges[j].Part != nil {
		return errSharedRow(i, l.cfg.Prefix)
	}
	if q.Charges[j].Cost > math.MaxInt64-c.cost {
		// Past int64, so past every capacity.
		return badArg(ErrCostExceedsCapacity, "the costs of %s of prefix %q add up to more than %d, capacity %d", quoteKey(c.key), l.cfg.Prefix, int64(math.MaxInt64), l.p.Capacity)
	}
	q.Charges[j].Cost += c.cost
	if cl.of != nil {
		cl.of[i] = j
	}
	if q.Charges[j].Cost > l.p.Capacity && !q.Charges[j].Policy.Grants && !q.Charges[j].Overrides {
		return badArg(ErrCostExceedsCapacity, "the costs of %s of prefix %q add up to %d, capacity %d", quoteKey(c.key), l.cfg.Prefix, q.Charges[j].Cost, l.p.Capacity)
	}
	return nil
}

// addLease adds charge i, c (a lease of a semaphore), to cl, checked:
// charges of one semaphore's key add up to one lease.
func (cl *call) addLease(i int, c Charge, first Charge) error {
	s := c.sem
	if err := s.validate(c.key, c.cost); err != nil {
		return err
	}
	if cl.lease == nil {
		id := cl.q.ID
		if id == "" {
			id = rand.Text()
		}
		cl.lease = &lease.Call{ID: id}
	}
	q, ch := cl.q, s.charge(lease.Acquire, c.key, 0)
	ch.Call = cl.lease
	j := slices.IndexFunc(q.Charges, func(o engine.Charge) bool { return o.Row == ch.Row })
	switch {
	case j < 0:
		j = len(q.Charges)
		q.Charges = append(q.Charges, ch)
	case q.Charges[j].Part != ch.Part:
		return errSharedRow(i, s.cfg.Prefix)
	}
	if q.Charges[j].Cost > s.cfg.Max-c.cost {
		return badArg(ErrCostExceedsCapacity, "the weights of %s of semaphore %q add up to more than its Max %d", quoteKey(c.key), s.cfg.Prefix, s.cfg.Max)
	}
	q.Charges[j].Cost += c.cost
	if cl.of != nil {
		cl.of[i] = j
	}
	return nil
}

// errSharedRow is the error of charge i on a key that a limiter and a
// semaphore (or semaphores of different limits) of prefix share.
func errSharedRow(i int, prefix string) error {
	return fmt.Errorf("%w: charge %d: limiters and semaphores of different limits share prefix %q and storage: their keys' rows cannot be charged together", ErrInvalidConfig, i, prefix)
}

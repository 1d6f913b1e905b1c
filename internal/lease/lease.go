// Package lease is pgratelimit's concurrency leases: a key has a limit of
// Max units, and a lease holds some of them (its weight) until it is
// released or its TTL passes without an Extend.
//
// Apply is the pure decision (no I/O, like internal/account): given a key's
// leases as stored and the check's clock, what an acquisition, a release or
// an extension does to them. Part is the engine.Part that takes a key's
// leases from its row (the leases column, read with the row's lock),
// decides each operation in arrival order with Apply, and writes the key's
// new leases back to the row before COMMIT.
package lease

import (
	"errors"
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Errors of operations that cannot apply. The root package returns them as
// its own.
var (
	// ErrExpired: a release or an extension of a lease whose TTL has
	// passed (its row is still there).
	ErrExpired = errors.New("pgratelimit: lease expired")
	// ErrNotFound: an extension of a lease the key does not have:
	// released, never acquired, or expired and deleted by cleanup.
	ErrNotFound = errors.New("pgratelimit: lease not found")
	// ErrMismatch: an acquisition retried with the ID of a live lease of
	// another weight.
	ErrMismatch = account.ErrRequestMismatch
)

// Lease is a lease of a key, as stored: an element of the JSON array in
// its row's leases column (see Encode; the tags name its fields for
// encoding/json, which Decode falls back to).
type Lease struct {
	ID         string    `json:"id"`
	Weight     int64     `json:"weight"`
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquired_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	// TTL is the semaphore's when it was acquired or last extended: the
	// lease is remembered for one TTL after it expired (see Forget).
	TTL time.Duration `json:"ttl"`
}

// Live says whether l counts at now: its expiry is after now.
func (l Lease) Live(now time.Time) bool { return now.Before(l.ExpiresAt) }

// Limit is a semaphore's: Max units per key, each lease counting for TTL
// after it was acquired or last extended.
type Limit struct {
	Max int64
	TTL time.Duration
}

// Kind is what an operation does.
type Kind int8

// The operations on a key's leases.
const (
	Acquire Kind = iota + 1
	Release
	Extend
)

// Op is one operation on a key's leases: of Kind, on the lease ID, with
// Weight (Acquire) and the fencing Token a new lease gets (Acquire).
type Op struct {
	Kind   Kind
	ID     string
	Weight int64
	Token  int64
}

// Outcome is what an operation found and did.
type Outcome struct {
	// Allowed: acquired (or replayed), released (or not held), extended.
	Allowed bool
	// Replayed: an acquisition found its ID's live lease and changed
	// nothing.
	Replayed bool
	// Lease is the lease acquired, replayed or extended, or the one
	// released (or found expired); zero when there is none.
	Lease Lease
	// Held is the units live leases hold after the operation (before it,
	// when denied).
	Held int64
	// RetryAfter is, for a denied acquisition, how long until enough of
	// the live leases expire for it, if none is extended or released.
	RetryAfter time.Duration
	// ResetAfter is how long until every live lease has expired.
	ResetAfter time.Duration
}

// Remaining is the units free under lim after o: Max less Held, at least 0
// (Held may pass a Max lowered since).
func (o Outcome) Remaining(lim Limit) int64 { return max(lim.Max-o.Held, 0) }

// Held is the units the live leases of ls hold at now (saturating).
func Held(ls []Lease, now time.Time) int64 {
	var n int64
	for _, l := range ls {
		if l.Live(now) {
			n = account.AddSat(n, l.Weight)
		}
	}
	return n
}

// Live returns the leases of ls live at now, in the order of ls.
func Live(ls []Lease, now time.Time) []Lease {
	var out []Lease
	for _, l := range ls {
		if l.Live(now) {
			out = append(out, l)
		}
	}
	return out
}

// Forget returns the leases of ls that a key remembers at now: the live
// ones, and those expired less than their TTL ago (a Release or an Extend
// of one says it expired). A lease expired longer ago is forgotten, as if
// it had never been acquired: whether its row has been written or cleaned
// up since, and by which semaphore, does not change an answer. It returns
// ls itself when it forgets none; ls is not changed.
func Forget(ls []Lease, now time.Time) []Lease {
	gone := func(l Lease) bool { return !now.Before(addSat(l.ExpiresAt, l.TTL)) }
	if !slices.ContainsFunc(ls, gone) {
		return ls
	}
	return slices.DeleteFunc(slices.Clone(ls), gone)
}

// Remembered is the time until which a key with leases ls must keep its
// row: the latest of their expiries plus TTL (see Forget); zero when ls is
// empty.
func Remembered(ls []Lease) time.Time {
	var last time.Time
	for _, l := range ls {
		if t := addSat(l.ExpiresAt, l.TTL); t.After(last) {
			last = t
		}
	}
	return last
}

// addSat is t plus d, at most account.MaxTime.
func addSat(t time.Time, d time.Duration) time.Time {
	if t.After(account.MaxTime.Add(-d)) {
		return account.MaxTime
	}
	return t.Add(d)
}

// Apply applies op to a key's leases ls under lim at now, after forgetting
// those expired at least their TTL ago (Forget). It returns the key's leases
// afterwards and the outcome; ls is not changed. A denied acquisition, a
// replay, a release of a lease not held and an error change nothing but
// what Forget dropped (and return the leases Forget returned).
func Apply(lim Limit, ls []Lease, now time.Time, op Op) ([]Lease, Outcome, error) {
	ls = Forget(ls, now)
	i := slices.IndexFunc(ls, func(l Lease) bool { return l.ID == op.ID })
	switch op.Kind {
	case Acquire:
		return acquire(lim, ls, i, now, op)
	case Release:
		if i < 0 {
			return ls, outcome(true, ls, now, Lease{}), nil // not held: nothing to do
		}
		if !ls[i].Live(now) {
			return ls, outcome(false, ls, now, ls[i]), ErrExpired
		}
		next := append(append(make([]Lease, 0, len(ls)-1), ls[:i]...), ls[i+1:]...)
		return next, outcome(true, next, now, ls[i]), nil
	case Extend:
		if i < 0 {
			return ls, outcome(false, ls, now, Lease{}), ErrNotFound
		}
		if !ls[i].Live(now) {
			return ls, outcome(false, ls, now, ls[i]), ErrExpired
		}
		next := slices.Clone(ls)
		if exp := expiry(now, lim.TTL); exp.After(next[i].ExpiresAt) {
			next[i].ExpiresAt = exp // never earlier than it was
		}
		next[i].TTL = max(next[i].TTL, lim.TTL)
		return next, outcome(true, next, now, next[i]), nil
	}
	return ls, Outcome{}, errors.New("pgratelimit: unknown lease operation") // a bug of ours
}

// acquire applies an acquisition; i is the index in ls of a lease with its
// ID, or -1.
func acquire(lim Limit, ls []Lease, i int, now time.Time, op Op) ([]Lease, Outcome, error) {
	if i >= 0 && ls[i].Live(now) {
		if ls[i].Weight != op.Weight {
			return ls, outcome(false, ls, now, Lease{}), ErrMismatch
		}
		o := outcome(true, ls, now, ls[i])
		o.Replayed = true
		return ls, o, nil
	}
	held := Held(ls, now)
	if held > lim.Max-op.Weight {
		o := outcome(false, ls, now, Lease{})
		o.RetryAfter = retryAfter(lim, ls, now, op.Weight)
		return ls, o, nil
	}
	l := Lease{ID: op.ID, Weight: op.Weight, Token: op.Token, AcquiredAt: now, ExpiresAt: expiry(now, lim.TTL), TTL: lim.TTL}
	next := make([]Lease, len(ls), len(ls)+1)
	copy(next, ls)
	if i >= 0 {
		next[i] = l // its expired lease of the same ID: acquired anew
	} else {
		next = append(next, l)
	}
	return next, outcome(true, next, now, l), nil
}

// outcome is the outcome of an operation that left ls, with lease l.
func outcome(allowed bool, ls []Lease, now time.Time, l Lease) Outcome {
	o := Outcome{Allowed: allowed, Lease: l, Held: Held(ls, now)}
	for _, x := range ls {
		if x.Live(now) {
			o.ResetAfter = max(o.ResetAfter, x.ExpiresAt.Sub(now))
		}
	}
	return o
}

// retryAfter is how long until enough units of ls expire for weight w
// under lim: account.Inf for a weight above Max.
func retryAfter(lim Limit, ls []Lease, now time.Time, w int64) time.Duration {
	if w > lim.Max {
		return account.Inf
	}
	live := Live(ls, now)
	slices.SortFunc(live, func(a, b Lease) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
	held := Held(live, now)
	var wait time.Duration
	for _, l := range live {
		held -= l.Weight
		wait = l.ExpiresAt.Sub(now)
		if held <= lim.Max-w {
			break
		}
	}
	return wait
}

// expiry is now plus ttl, at most account.MaxTime.
func expiry(now time.Time, ttl time.Duration) time.Time { return addSat(now, ttl) }

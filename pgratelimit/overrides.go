package pgratelimit

import (
	"context"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Limits as data: per-key overrides of a limiter's Capacity and Refill,
// changed at run time, and the policies limiters run, recorded for tools
// (package admin reads them). See docs/overrides.md.

// maxOverrideNote is the longest Override.Note, in bytes.
const maxOverrideNote = 1024

// Override replaces a key's Capacity and Refill (Config.Overrides): for
// one customer's bigger plan, a trial, a temporary block. The limiter's
// schedule (Interval or Calendar) stays.
type Override struct {
	// Capacity and Refill replace the limiter's. Both >= 1.
	Capacity, Refill int64
	// Until is when the override ends, by the checks' clock: from then on
	// the limiter's policy applies again. The zero time: no end.
	Until time.Time
	// Note says why, for operators (at most 1024 bytes).
	Note string
}

// SetOverride sets key's override o, in one transaction that locks the
// key's bucket row (in the caller's transaction through In), and changes
// the bucket's plan to it at once, as a check under another Capacity does:
// a bigger Capacity adds the difference, a smaller one clamps the tokens to
// it, with Config.Ledger's "plan" row. From its commit on, every check of a
// limiter with Config.Overrides on this Prefix decides key with o, on every
// instance, until o.Until. It returns key's bucket as Peek reports it
// afterwards. The limiter must have Config.Overrides, and o valid
// (Capacity and Refill >= 1, Until zero or after the limiter's clock, Note
// at most 1024 bytes of UTF-8 without NUL): else
// ErrInvalidArgument.
func (l *Limiter) SetOverride(ctx context.Context, key string, o Override) (Result, error) {
	if err := l.checkOverride(key, &o); err != nil {
		return Result{}, err
	}
	eo := engine.Override{Capacity: o.Capacity, Refill: o.Refill, Until: o.Until, Note: o.Note}
	r, err := l.plan(ctx, key, &eo, "set the override of "+quoteKey(key))
	if err == nil {
		l.metrics.overridesSet.Add(ctx, 1, l.metrics.prefixAttr...)
	}
	return r, err
}

// ClearOverride deletes key's override, in one transaction that locks the
// key's bucket row (in the caller's transaction through In); clearing a
// key without one changes nothing. The limiter's policy applies again from
// the next operation that locks the row (with Config.Ledger, its "plan"
// row then). It returns key's bucket as Peek reports it afterwards. The
// limiter must have Config.Overrides (else ErrInvalidArgument).
func (l *Limiter) ClearOverride(ctx context.Context, key string) (Result, error) {
	if err := l.checkOverride(key, nil); err != nil {
		return Result{}, err
	}
	r, err := l.plan(ctx, key, nil, "clear the override of "+quoteKey(key))
	if err == nil {
		l.metrics.overridesCleared.Add(ctx, 1, l.metrics.prefixAttr...)
	}
	return r, err
}

// checkOverride checks a SetOverride (o not nil) or ClearOverride of key,
// and brings o.Until to PostgreSQL's microseconds.
func (l *Limiter) checkOverride(key string, o *Override) error {
	if !l.cfg.Overrides {
		return badArg(ErrInvalidArgument, "override on prefix %q, whose limiter has Config.Overrides off: its checks would not read it", l.cfg.Prefix)
	}
	if err := validateKey(key); err != nil {
		return err
	}
	if o == nil {
		return nil
	}
	switch {
	case o.Capacity < 1:
		return badArg(ErrInvalidArgument, "override Capacity %d is below 1", o.Capacity)
	case o.Refill < 1:
		return badArg(ErrInvalidArgument, "override Refill %d is below 1", o.Refill)
	case len(o.Note) > maxOverrideNote:
		return badArg(ErrInvalidArgument, "override Note is %d bytes, longer than %d", len(o.Note), maxOverrideNote)
	case !utf8.ValidString(o.Note) || strings.IndexByte(o.Note, 0) >= 0:
		return badArg(ErrInvalidArgument, "override Note is not UTF-8 text without NUL")
	case o.Until.After(account.MaxTime):
		return badArg(ErrInvalidArgument, "override Until %s is out of range", o.Until.Format(time.RFC3339))
	}
	o.Until = o.Until.Truncate(time.Microsecond)
	if !o.Until.IsZero() && !o.Until.After(l.localNow()) {
		return badArg(ErrInvalidArgument, "override Until %s is not after now", o.Until.Format(time.RFC3339Nano))
	}
	return nil
}

// plan runs an OpPlan request on key: set o, or clear (o nil).
func (l *Limiter) plan(ctx context.Context, key string, o *engine.Override, what string) (Result, error) {
	l.client.forgetDenied(l.cfg.Prefix, key)
	q := &engine.Request{Ctx: ctx, Kind: account.OpPlan, Charges: []engine.Charge{l.charge(key, 0)}, Override: o}
	if err := l.run(q, l.settings(), false, what); err != nil {
		return Result{}, err
	}
	return resultOf(q.Outcomes[0].Outcome), nil
}

// peekOverride is what Peek adds to read key's override with its bucket:
// the statement, and the policy that decides key once it has run.
func (l *Limiter) peekOverride(key string) ([]engine.Stmt, func(now time.Time) account.Policy) {
	if !l.cfg.Overrides {
		return nil, func(time.Time) account.Policy { return l.p }
	}
	var o engine.Override
	read := engine.ReadOverride(l.row(key), func(r engine.Override) { o = r })
	return []engine.Stmt{read}, func(now time.Time) account.Policy {
		if o.Live(now) {
			return o.Policy(l.p)
		}
		return l.p
	}
}

// policyNote records a limiter's policy in pgratelimit_policies once per
// process (per Client): shared by the copies of a limiter (In, WithAnchor).
type policyNote struct {
	done atomic.Bool
	args []any // the Record statement's
}

func newPolicyNote(cfg Config) *policyNote {
	sched := "every " + cfg.Interval.String()
	if c := cfg.Calendar; c != (Calendar{}) {
		loc := "UTC"
		if c.Location != nil {
			loc = c.Location.String()
		}
		sched = "calendar " + c.Every.String() + " " + loc
		if !c.Anchor.IsZero() {
			sched += " anchor " + c.Anchor.In(time.UTC).Format(time.RFC3339Nano)
		}
	}
	var features []string
	for _, f := range []struct {
		on   bool
		name string
	}{{cfg.Grants, "grants"}, {cfg.Ledger, "ledger"}, {!cfg.Alerts.thresholds().Empty(), "alerts"}, {cfg.Overrides, "overrides"}} {
		if f.on {
			features = append(features, f.name)
		}
	}
	return &policyNote{args: []any{cfg.Prefix, cfg.Storage.String(), cfg.Capacity, cfg.Refill, sched, strings.Join(features, ",")}}
}

// asyncPolicyTimeout bounds notePolicy's record for an operation in the
// caller's transaction.
const asyncPolicyTimeout = 30 * time.Second

// notePolicy records l's policy at its first operation in this process:
// one statement on the pool, bounded by the operation's context (a check's
// deadline, a middleware's CheckTimeout, bounds it too). A failure (a
// schema without migration 00010, a context that ended) is not the
// operation's: tools then show no policy. For an operation in the caller's
// transaction (inTx) it is never the transaction's statement (whose
// failure it must not cause) and the operation does not wait for it: it
// runs on a goroutine of its own, within asyncPolicyTimeout, since the
// caller's transactions may hold every connection of the pool until this
// operation returns.
func (l *Limiter) notePolicy(ctx context.Context, inTx bool) {
	n := l.note
	if n == nil || l.client.noRecord || l.client.mem != nil || n.done.Load() || !n.done.CompareAndSwap(false, true) {
		return
	}
	if l.client.notedPolicy(n.args) {
		return
	}
	if inTx {
		go func() {
			// Not ended by the operation's end (a request's context
			// often is), but bounded.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), asyncPolicyTimeout)
			defer cancel()
			_, _ = l.client.pool.Exec(ctx, sqlgen.Policies.Record, n.args...)
		}()
		return
	}
	_, _ = l.client.pool.Exec(ctx, sqlgen.Policies.Record, n.args...)
}

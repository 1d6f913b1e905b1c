package integration

// The money walk: random sequences of every operation on a key's balance
// (charges, debits, refunds, settlements, grants, resets, AllowAll, and
// per-key overrides set, some until a time the clock passes, and cleared),
// with request IDs reused, cleanup, clock moves across refills, period ends,
// grant expiries and overrides' ends, and plan changes, against the pure account model
// (internal/account) applied one operation at a time: every result compared,
// the ledger audited against the model's entries and the balances after
// each run. Faults (short deadlines, terminated backends) hit operations
// with request IDs, which are retried until answered: a retry must return
// exactly what the model says the operation got.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
	"github.com/stretchr/testify/require"
)

// walkPlans are the plans of the walk's limiters, on one prefix: a rate on
// a grid, and two monthly quotas anchored on the 31st (plan changes between
// all three).
var walkAnchor = time.Date(2025, 1, 31, 9, 0, 0, 0, time.UTC)

func walkPlans() []pgratelimit.Config {
	month := pgratelimit.Calendar{Every: pgratelimit.Month, Anchor: walkAnchor}
	return []pgratelimit.Config{
		{Capacity: 100, Refill: 30, Interval: time.Hour},
		{Capacity: 250, Refill: 250, Calendar: month},
		{Capacity: 40, Refill: 40, Calendar: month},
	}
}

// policyOf is cfg's policy in the model's words.
func policyOf(cfg pgratelimit.Config) account.Policy {
	p := account.Policy{Capacity: cfg.Capacity, Refill: cfg.Refill, Schedule: account.Grid(cfg.Interval),
		Grants: cfg.Grants, Ledger: cfg.Ledger, Retention: cfg.RequestIDRetention}
	if cfg.Calendar.Every != 0 {
		p.Schedule = account.Calendar(account.Period(cfg.Calendar.Every), time.UTC, cfg.Calendar.Anchor)
	}
	return p
}

// walker runs one walk.
type walker struct {
	t      *testing.T
	rng    *mrand.Rand
	clock  *fakeClock
	plans  []*pgratelimit.Limiter
	pols   []account.Policy
	keys   []string
	faults func() (context.Context, context.CancelFunc) // nil: none

	mu      sync.Mutex
	stats   map[string]int // what the walk did, for the log
	model   map[string]*account.State
	ledger  map[string][]walkEntry  // the entries the model wrote, per key
	ids     map[string][]string     // the request IDs used on each key
	ovs     map[string]walkOverride // each key's override, as set
	past    map[string][]walkOp     // the operations with IDs on each key
	nextID  int
	retries int
}

type walkEntry struct {
	account.Entry
	id string
}

// walkOp is one operation of the walk on one key.
type walkOp struct {
	key     string
	plan    int
	kind    account.Kind
	amount  int64
	id      string
	expires time.Time
	// override is what an OpPlan operation sets (SetOverride); nil: it
	// clears (ClearOverride).
	override *walkOverride
}

// walkOverride is a key's override in the model.
type walkOverride struct {
	capacity, refill int64
	until            time.Time // zero: no end
}

// policy is the policy the walk's plan decides key with at now: its
// override's while it lasts, else the plan's.
func (w *walker) policy(plan int, key string, now time.Time) account.Policy {
	p := w.pols[plan]
	if o, ok := w.ovs[key]; ok && (o.until.IsZero() || now.Before(o.until)) {
		p.Capacity, p.Refill = o.capacity, o.refill
	}
	return p
}

func (op walkOp) String() string {
	return fmt.Sprintf("%s %s %d on %s (plan %d, id %q, expires %v)", op.kind, "", op.amount, op.key, op.plan, op.id, op.expires)
}

func newWalker(t *testing.T, pool *pgxpool.Pool, seed uint64) *walker {
	w := &walker{t: t, rng: mrand.New(mrand.NewPCG(seed, 31)), clock: newClock(), keys: []string{"a", "b", "c", "d", "e", "f"},
		stats: map[string]int{}, model: map[string]*account.State{}, ledger: map[string][]walkEntry{}, ids: map[string][]string{}, past: map[string][]walkOp{},
		ovs: map[string]walkOverride{}}
	for _, cfg := range walkPlans() {
		cfg.Prefix, cfg.Grants, cfg.Ledger, cfg.Overrides, cfg.Clock = "walk", true, true, true, w.clock.Now
		cfg.RequestIDRetention = 24 * time.Hour
		l, err := newLimiterOn(pool, cfg)
		require.NoError(t, err)
		w.plans = append(w.plans, l)
		w.pols = append(w.pols, policyOf(cfg))
	}
	for _, k := range w.keys {
		w.model[k] = &account.State{}
	}
	return w
}

// id is a request ID for an operation on key: none, a new one, or one used
// on key before.
func (w *walker) id(key string, need bool) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch n := w.rng.IntN(6); {
	case n == 0 && !need:
		return ""
	case n <= 4 || len(w.ids[key]) == 0:
		w.nextID++
		id := "r" + strconv.Itoa(w.nextID)
		w.ids[key] = append(w.ids[key], id)
		return id
	default:
		return w.ids[key][w.rng.IntN(len(w.ids[key]))]
	}
}

func (w *walker) amount() int64 {
	if w.rng.IntN(6) == 0 {
		return 1 + w.rng.Int64N(400)
	}
	return 1 + w.rng.Int64N(40)
}

// pick chooses an operation on key: often an earlier one again with its
// request ID (a retry: replayed, or decided afresh if it was denied or its
// record expired), settlements of earlier charges and debits, new
// operations with a new ID, none, or an ID of another operation (a
// mismatch). Under faults every operation that writes carries a request ID,
// so that it can be retried.
func (w *walker) pick(key string) walkOp {
	w.mu.Lock()
	past := w.past[key]
	n := w.rng.IntN(22)
	w.mu.Unlock()
	need := w.faults != nil
	if n < 5 && len(past) > 0 {
		return past[w.rng.IntN(len(past))] // again
	}
	op := walkOp{key: key, plan: w.rng.IntN(len(w.plans))}
	switch {
	case n < 9:
		op.kind, op.amount, op.id = account.OpCharge, w.amount(), w.id(key, need)
	case n < 11:
		op.kind, op.amount, op.id = account.OpDebit, w.amount(), w.id(key, need)
	case n < 12:
		op.kind, op.amount, op.id = account.OpRefund, w.amount(), w.id(key, need)
	case n < 15:
		op.kind, op.amount, op.id = account.OpSettle, w.amount()-1, w.id(key, true)
		for _, p := range past {
			if (p.kind == account.OpCharge || p.kind == account.OpDebit) && w.rng.IntN(2) == 0 {
				op.id = p.id
			}
		}
	case n < 18:
		op.kind, op.amount, op.id = account.OpGrant, w.amount(), w.id(key, need)
		if m := w.rng.IntN(4); m > 0 {
			op.expires = w.clock.Now().Add(time.Duration(m*w.rng.IntN(300)) * time.Minute)
		}
	case n < 19 && !need:
		op.kind = account.OpReset
	case n == 20:
		// An override (no request ID: setting it again changes nothing
		// more, so a retry is safe), until a time the clock may pass.
		op.kind = account.OpPlan
		op.override = &walkOverride{capacity: []int64{20, 60, 150, 400}[w.rng.IntN(4)], refill: []int64{5, 40, 150}[w.rng.IntN(3)]}
		if w.rng.IntN(2) == 0 {
			op.override.until = w.clock.Now().Add(time.Duration(1+w.rng.IntN(8)) * 13 * time.Minute)
		}
	case n == 21:
		op.kind = account.OpPlan // clear
	default:
		op.kind = 0 // a Peek
	}
	if op.id != "" && op.kind != account.OpReset {
		w.mu.Lock()
		w.past[key] = append(w.past[key], op)
		w.mu.Unlock()
	}
	return op
}

// charge is an earlier charge with an ID on key again, or a new one.
func (w *walker) charge(key string) walkOp {
	w.mu.Lock()
	var charges []walkOp
	for _, p := range w.past[key] {
		if p.kind == account.OpCharge {
			charges = append(charges, p)
		}
	}
	w.mu.Unlock()
	if len(charges) > 0 && w.rng.IntN(3) > 0 {
		return charges[w.rng.IntN(len(charges))]
	}
	op := walkOp{key: key, plan: w.rng.IntN(len(w.plans)), kind: account.OpCharge, amount: w.amount(), id: w.id(key, true)}
	w.mu.Lock()
	w.past[key] = append(w.past[key], op)
	w.mu.Unlock()
	return op
}

// got is what the API answered.
type got struct {
	res   pgratelimit.Result
	grant pgratelimit.Grant
	err   error
}

// call runs op through the API in ctx.
func (w *walker) call(ctx context.Context, op walkOp) got {
	l := w.plans[op.plan]
	if op.id != "" && op.kind != account.OpSettle {
		ctx = pgratelimit.WithRequestID(ctx, op.id)
	}
	var g got
	switch op.kind {
	case account.OpCharge:
		g.res, g.err = l.AllowN(ctx, op.key, op.amount)
	case account.OpDebit:
		g.res, g.err = l.Debit(ctx, op.key, op.amount)
	case account.OpRefund:
		g.res, g.err = l.Refund(ctx, op.key, op.amount)
	case account.OpSettle:
		g.res, g.err = l.Settle(ctx, op.key, op.id, op.amount)
	case account.OpGrant:
		g.grant, g.err = l.Grant(ctx, op.key, op.amount, op.expires)
	case account.OpReset:
		g.err = l.Reset(ctx, op.key)
	case account.OpPlan:
		if o := op.override; o != nil {
			g.res, g.err = l.SetOverride(ctx, op.key, pgratelimit.Override{Capacity: o.capacity, Refill: o.refill, Until: o.until, Note: "walk"})
		} else {
			g.res, g.err = l.ClearOverride(ctx, op.key)
		}
	default:
		g.res, g.err = l.Peek(ctx, op.key)
	}
	return g
}

// sentinel says whether err is an answer (an error the model gives too)
// rather than a fault.
func sentinel(err error) bool {
	return err == nil || errors.Is(err, pgratelimit.ErrRequestMismatch) || errors.Is(err, pgratelimit.ErrUnknownRequest) ||
		errors.Is(err, pgratelimit.ErrGrantExpired) || errors.Is(err, pgratelimit.ErrCostExceedsCapacity)
}

// run runs op, under a fault when there are faults and op carries an ID,
// retrying until it is answered.
func (w *walker) run(op walkOp) got {
	if w.faults != nil && op.id != "" {
		ctx, cancel := w.faults()
		g := w.call(ctx, op)
		cancel()
		if sentinel(g.err) {
			return g
		}
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g := w.call(ctx, op)
		cancel()
		if sentinel(g.err) || try > 50 {
			return g
		}
		w.mu.Lock()
		w.retries++
		w.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// check applies op to the model and compares it with what the API said.
func (w *walker) check(op walkOp, g got) {
	t := w.t
	now := w.clock.Now().Truncate(time.Microsecond)
	p := w.policy(op.plan, op.key, now)
	st := w.model[op.key]
	if op.kind == account.OpPlan {
		w.override(op, g, now)
		return
	}
	if op.kind == 0 {
		require.NoError(t, g.err, "%v", op)
		require.Equal(t, resultOfOutcome(account.Look(p, *st, now, 1)), g.res, "%v: peek", op)
		return
	}
	mop := account.Op{Kind: op.kind, Amount: op.amount, ID: op.id, GrantID: g.grant.ID, ExpiresAt: op.expires.Truncate(time.Microsecond)}
	ns, c, err := account.Apply(p, *st, now, mop)
	w.count(op.kind, c, err)
	if err != nil || g.err != nil {
		require.Truef(t, errors.Is(g.err, err) || err == nil && g.err == nil, "%v: got %v, the model says %v", op, g.err, err)
		require.Error(t, g.err, "%v: the model says %v", op, err)
		return
	}
	switch op.kind {
	case account.OpGrant:
		want := pgratelimit.Grant{ID: c.Grant.ID, Amount: c.Grant.Amount, ExpiresAt: c.Grant.ExpiresAt, GrantedAt: c.Grant.GrantedAt}
		require.Equal(t, utcGrant(want), utcGrant(g.grant), "%v", op)
	case account.OpReset:
	default:
		want := resultOfChange(c)
		if w.faults != nil && g.res.Replayed {
			// Retried until answered: the first try may have committed
			// with its reply lost, and the retry replayed it.
			want.Replayed = true
		}
		require.Equal(t, want, g.res, "%v", op)
	}
	*st = ns
	if c.Allowed && !c.Replayed {
		for _, e := range c.Entries {
			w.ledger[op.key] = append(w.ledger[op.key], walkEntry{e, op.id})
		}
	}
}

// override applies an override set or cleared to the model: set, the key's
// plan changes to it at once (its ledger's plan row); cleared, the plan's
// policy applies again from the next operation. Both answer as Peek.
func (w *walker) override(op walkOp, g got, now time.Time) {
	t := w.t
	require.NoError(t, g.err, "%v", op)
	st := w.model[op.key]
	if o := op.override; o != nil {
		w.ovs[op.key] = *o
		p := w.policy(op.plan, op.key, now)
		ns, c, err := account.Apply(p, *st, now, account.Op{Kind: account.OpPlan})
		require.NoError(t, err)
		*st = ns
		for _, e := range c.Entries {
			w.ledger[op.key] = append(w.ledger[op.key], walkEntry{e, ""})
		}
		w.stats["override set"]++
	} else {
		delete(w.ovs, op.key)
		w.stats["override cleared"]++
	}
	require.Equal(t, resultOfOutcome(account.Look(w.policy(op.plan, op.key, now), *st, now, 1)), g.res, "%v", op)
}

// count notes what an operation did, for the log.
func (w *walker) count(k account.Kind, c account.Change, err error) {
	switch {
	case err != nil:
		w.stats[k.String()+" error"]++
	case c.Replayed:
		w.stats[k.String()+" replayed"]++
	case !c.Allowed:
		w.stats[k.String()+" denied"]++
	default:
		w.stats[k.String()]++
	}
}

func utcGrant(g pgratelimit.Grant) pgratelimit.Grant {
	g.ExpiresAt, g.GrantedAt = g.ExpiresAt.UTC(), g.GrantedAt.UTC()
	return g
}

func resultOfOutcome(o account.Outcome) pgratelimit.Result {
	return pgratelimit.Result{Allowed: o.Allowed, Limit: o.Limit, Remaining: o.Remaining, RetryAfter: o.RetryAfter,
		ResetAfter: o.ResetAfter, Granted: o.Granted}
}

// resultOfChange is the Result of an operation the model decided: its
// outcome, and, when allowed, whether it was a replay and what the grants
// paid.
func resultOfChange(c account.Change) pgratelimit.Result {
	r := resultOfOutcome(c.Outcome)
	if c.Allowed {
		r.Replayed, r.FromGrants = c.Replayed, c.FromGrants
	}
	return r
}

// allowAll charges two keys at once (all or nothing) with one plan, with
// or without an ID, and checks it against the model.
func (w *walker) allowAll() {
	t := w.t
	a, b := w.keys[0], w.keys[1+w.rng.IntN(len(w.keys)-1)]
	plan := w.rng.IntN(len(w.plans))
	l := w.plans[plan]
	ca, cb := w.amount(), w.amount()
	ctx := context.Background()
	var id string
	if w.rng.IntN(2) == 0 || w.faults != nil {
		id = w.id(a, true)
		ctx = pgratelimit.WithRequestID(ctx, id)
	}
	var (
		m   pgratelimit.MultiResult
		err error
	)
	for try := 0; try == 0 || !sentinel(err) && try < 50; try++ { // with an ID under faults: retried until answered
		m, err = pgratelimit.AllowAll(ctx, l.Charge(a, ca), l.Charge(b, cb))
	}
	if errors.Is(err, pgratelimit.ErrCostExceedsCapacity) {
		return // a cost above Capacity without grants would be; these have grants
	}
	now := w.clock.Now()
	sa, sb := w.model[a], w.model[b]
	na, xa, ea := account.Apply(w.policy(plan, a, now), *sa, now, account.Op{Kind: account.OpCharge, Amount: ca, ID: id})
	nb, xb, eb := account.Apply(w.policy(plan, b, now), *sb, now, account.Op{Kind: account.OpCharge, Amount: cb, ID: id})
	ra, rb := id != "" && live(sa, id, now), id != "" && live(sb, id, now)
	if ea != nil || eb != nil || ra != rb {
		require.Error(t, err, "AllowAll %s %d, %s %d, id %q: the model says %v %v (recorded %v %v)", a, ca, b, cb, id, ea, eb, ra, rb)
		return
	}
	require.NoError(t, err)
	allowed := xa.Allowed && xb.Allowed
	require.Equal(t, allowed, m.Allowed, "AllowAll %s %d, %s %d", a, ca, b, cb)
	if !allowed {
		return
	}
	for i, x := range []account.Change{xa, xb} {
		want := resultOfChange(x)
		if w.faults != nil && m.Results[i].Replayed {
			want.Replayed = true // retried until answered, as in check
		}
		require.Equal(t, want, m.Results[i])
	}
	*sa, *sb = na, nb
	for _, x := range []struct {
		key string
		c   account.Change
	}{{a, xa}, {b, xb}} {
		if !x.c.Replayed {
			for _, e := range x.c.Entries {
				w.ledger[x.key] = append(w.ledger[x.key], walkEntry{e, id})
			}
		}
	}
}

func live(s *account.State, id string, now time.Time) bool {
	r, ok := s.Records[id]
	return ok && r.Live(now)
}

// step runs one step: maybe a clock move or a cleanup, then an operation on
// every key at once (each key's in order: keys are independent, so any
// interleaving is one by one), or an AllowAll.
func (w *walker) step(pool *pgxpool.Pool) {
	switch w.rng.IntN(10) {
	case 0, 1:
		w.clock.Add(time.Duration(w.rng.IntN(60)) * 13 * time.Minute)
	case 2:
		var err error
		for try := 0; try == 0 || err != nil && try < 20; try++ { // a terminated backend fails a run
			_, err = deleteExpired(context.Background(), pool, pgratelimit.CleanerConfig{Clock: w.clock.Now})
		}
		require.NoError(w.t, err)
	case 3:
		w.allowAll()
		return
	}
	burst := w.rng.IntN(4) == 0
	ops := make([]walkOp, len(w.keys))
	gots := make([]got, len(w.keys))
	for i, k := range w.keys {
		ops[i] = w.pick(k)
		if burst {
			// Checks of every key at once, coalesced into shared
			// transactions: earlier charges again (replays), or new ones.
			ops[i] = w.charge(k)
		}
	}
	var wg sync.WaitGroup
	for i := range ops {
		wg.Go(func() { gots[i] = w.run(ops[i]) })
	}
	wg.Wait()
	for i := range ops {
		w.check(ops[i], gots[i])
	}
}

// audit compares every key's ledger, grants and balance with the model's.
func (w *walker) audit(pool *pgxpool.Pool) {
	t := w.t
	ctx := context.Background()
	l := w.plans[0]
	now := w.clock.Now()
	for _, k := range w.keys {
		es, err := l.Ledger(ctx, k, time.Time{})
		require.NoError(t, err)
		want := w.ledger[k]
		if len(es) != len(want) {
			t.Fatalf("key %s: %d ledger rows, the model wrote %d", k, len(es), len(want))
		}
		for i, e := range es {
			x := want[i]
			require.Equal(t, []any{x.Kind.String(), x.Amount, x.GrantsAmount, x.Balance, x.Granted, x.id},
				[]any{e.Kind, e.Amount, e.GrantsAmount, e.Balance, e.Granted, e.RequestID}, "key %s: ledger row %d", k, i)
		}
		gs, err := l.Grants(ctx, k)
		require.NoError(t, err)
		var sum int64
		for _, g := range gs {
			require.Positive(t, g.Amount)
			sum += g.Amount
		}
		require.Equal(t, account.Granted(w.model[k].Grants, now), sum, "key %s: grants", k)
		for _, id := range w.ids[k] {
			got, err := admin.LookupRequest(ctx, pool, l.Config().Prefix, k, id)
			rec, ok := w.model[k].Records[id]
			if !ok || !rec.Live(now) {
				// Forgotten: gone, or its row left until cleanup deletes it.
				if err == nil {
					require.False(t, got.ExpiresAt.After(now), "key %s, request %s: %+v is remembered, the model forgot it", k, id, got)
				} else {
					require.ErrorIs(t, err, pgratelimit.ErrUnknownRequest, "key %s, request %s", k, id)
				}
				continue
			}
			require.NoError(t, err)
			want := admin.Request{Prefix: l.Config().Prefix, Key: k, ID: id, Kind: rec.Kind.String(), Amount: rec.Amount, Result: resultOfOutcome(rec.Outcome),
				Grant:   utcGrant(pgratelimit.Grant{ID: rec.Grant.ID, Amount: rec.Grant.Amount, ExpiresAt: rec.Grant.ExpiresAt, GrantedAt: rec.Grant.GrantedAt}),
				Settled: rec.Settled, Actual: rec.Actual, At: rec.CreatedAt.UTC(), ExpiresAt: rec.ExpiresAt.UTC()}
			want.Result.FromGrants = rec.Outcome.FromGrants
			if rec.Settled {
				want.Settlement = resultOfOutcome(rec.Settlement)
				want.Settlement.FromGrants = rec.Settlement.FromGrants
			}
			got.Grant, got.At, got.ExpiresAt = utcGrant(got.Grant), got.At.UTC(), got.ExpiresAt.UTC()
			require.Equal(t, want, got, "key %s, request %s", k, id)
		}
	}
}

// walkSteps is how many steps a walk takes: PGRATELIMIT_WALK_STEPS, else a
// short walk for make test.
func walkSteps() int {
	if n, err := strconv.Atoi(os.Getenv("PGRATELIMIT_WALK_STEPS")); err == nil && n > 0 {
		return n
	}
	return 120
}

// walkSeed is PGRATELIMIT_WALK_SEED, else a fixed one (make test is
// seeded; make test-walk sets random ones).
func walkSeed(t *testing.T) uint64 {
	if s, err := strconv.ParseUint(os.Getenv("PGRATELIMIT_WALK_SEED"), 10, 64); err == nil {
		return s
	}
	return 20261125
}

// walk walks under faults (nil: none), waits for settle (nil: nothing to
// wait for; the faults' terminations still under way), then audits.
func walk(t *testing.T, pool *pgxpool.Pool, faults func() (context.Context, context.CancelFunc), settle func()) {
	seed := walkSeed(t)
	w := newWalker(t, pool, seed)
	w.faults = faults
	for range walkSteps() {
		w.step(pool)
		if t.Failed() {
			break
		}
	}
	if settle != nil {
		settle()
	}
	w.audit(pool)
	t.Logf("seed %d: %d steps, %d retries, %v", seed, walkSteps(), w.retries, w.stats)
}

// TestMoneyWalk walks without faults.
func TestMoneyWalk(t *testing.T) {
	t.Parallel()
	walk(t, newPool(t), nil, nil)
}

// TestMoneyWalkUnderFaults walks with a short deadline or a terminated
// backend on a third of the operations with request IDs.
func TestMoneyWalkUnderFaults(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	cfg := s.Config.Copy()
	app := "walk-" + randomHex()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool := s.PoolWithConfig(t, cfg)
	admin := s.Pool(t, 2)
	walkFaults(t, pool, admin, "application_name = '"+app+"'")
}

// TestMoneyWalkThroughPgBouncer walks through PgBouncer in transaction
// mode, with short deadlines (pgx cancels the statements in flight).
// Not with terminated backends: PgBouncer 1.18 (Debian 12's) exits with
// "server_proto: server in bad state" when a server connection it is
// reading a pipeline from is terminated, which no client can cure.
func TestMoneyWalkThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pool := pgbouncerPool(t)
	walkFaults(t, pool, nil, "")
}

// walkFaults walks with a short deadline on a third of the operations with
// request IDs and, when which names this walk's backends, a terminated
// backend on another third.
func walkFaults(t *testing.T, pool, admin *pgxpool.Pool, which string) {
	rng := mrand.New(mrand.NewPCG(walkSeed(t), 7))
	var mu sync.Mutex
	kinds := 3
	if which == "" {
		kinds = 1
	}
	var terminating sync.WaitGroup // the audit reads once every termination is done
	walk(t, pool, func() (context.Context, context.CancelFunc) {
		mu.Lock()
		n, d := rng.IntN(kinds), time.Duration(rng.IntN(2000))*time.Microsecond
		mu.Unlock()
		switch n {
		case 0:
			return context.WithTimeout(context.Background(), d)
		case 1:
			terminating.Go(func() {
				time.Sleep(d)
				_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE `+which+` AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			})
		}
		return context.WithTimeout(context.Background(), 10*time.Second)
	}, func() {
		terminating.Wait()
		pool.Reset() // the audit reads on connections no termination reached
	})
}

func randomHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

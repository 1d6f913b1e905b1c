package account

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"
)

// walk is a random sequence of operations on one key, with clock moves,
// plan changes, request IDs reused and cleanup, decoded from fuzz input.
type walk struct {
	data   []byte
	pols   []Policy
	now    time.Time
	nextID int64
	s      State // the key's state
	clean  State // the same key, with cleanup run now and then
	ids    []string
	log    []string
}

func (w *walk) byte() byte {
	if len(w.data) == 0 {
		return 0
	}
	b := w.data[0]
	w.data = w.data[1:]
	return b
}

func (w *walk) amount() int64 {
	switch b := w.byte(); b % 8 {
	case 0:
		return 1
	case 7:
		return int64(w.byte())*37 + int64(b)
	default:
		return int64(b%40) + 1
	}
}

func (w *walk) id() string {
	b := w.byte()
	if b%3 == 0 {
		return ""
	}
	if b%3 == 1 && len(w.ids) > 0 {
		return w.ids[int(b/3)%len(w.ids)]
	}
	id := fmt.Sprintf("r%d", len(w.ids))
	w.ids = append(w.ids, id)
	return id
}

// op decodes the next operation, and how long the account remembers its
// request ID.
func (w *walk) op() (Op, time.Duration) {
	retention := time.Duration(w.byte()%4+1) * time.Hour
	return w.op1(), retention
}

// op1 decodes the next operation.
func (w *walk) op1() Op {
	switch k := w.byte() % 12; {
	case k < 5:
		return Op{Kind: OpCharge, Amount: w.amount(), ID: w.id()}
	case k < 6:
		return Op{Kind: OpDebit, Amount: w.amount(), ID: w.id()}
	case k < 7:
		return Op{Kind: OpRefund, Amount: w.amount(), ID: w.id()}
	case k < 9:
		var id string
		if len(w.ids) > 0 {
			id = w.ids[int(w.byte())%len(w.ids)]
		} else {
			id = "none"
		}
		return Op{Kind: OpSettle, Amount: w.amount() - 1, ID: id}
	case k < 11:
		w.nextID++
		var exp time.Time
		if b := w.byte(); b%3 != 0 {
			exp = w.now.Add(time.Duration(b) * 7 * time.Minute)
		}
		return Op{Kind: OpGrant, Amount: w.amount(), ID: w.id(), GrantID: w.nextID, ExpiresAt: exp}
	}
	return Op{Kind: OpReset}
}

// cleanup deletes what cleanup deletes: an expired bucket, spent grants
// (expired ones only once no entry is owed: Ledger false), expired records.
func cleanup(s State, now time.Time) State {
	if !now.Before(s.Bucket.ExpiresAt) {
		s.Bucket = Bucket{}
	}
	s.Grants = slices.DeleteFunc(slices.Clone(s.Grants), func(g Grant) bool {
		return g.Amount == 0 || !g.Live(now) && !g.Ledger
	})
	s.Records = maps.Clone(s.Records)
	maps.DeleteFunc(s.Records, func(_ string, r Record) bool { return !r.Live(now) })
	return s
}

func (w *walk) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s\nafter:\n%s", fmt.Sprintf(format, args...), w.log)
}

// step applies the next operation to both states and checks the invariants.
func (w *walk) step(t *testing.T) {
	t.Helper()
	switch b := w.byte(); b % 4 {
	case 0:
		w.now = w.now.Add(time.Duration(w.byte()) * 13 * time.Minute)
	case 1:
		w.clean = cleanup(w.clean, w.now)
	}
	p := w.pols[int(w.byte())%len(w.pols)]
	op, retention := w.op()
	p.Ledger, p.Retention = true, retention
	w.log = append(w.log, fmt.Sprintf("%s cap %d: %+v", w.now.Format(time.TimeOnly), p.Capacity, op))
	peek := Look(p, w.s, w.now, max(op.Amount, 1))
	tokens, granted := balanceOf(p, w.s, w.now)
	ns, c, err := Apply(p, w.s, w.now, op)
	nc, cc, cerr := Apply(p, w.clean, w.now, op)
	// Without a ledger: the same state and outcome, no entries.
	quiet := p
	quiet.Ledger = op.Kind == OpGrant // a grant's mark is part of the state
	qs, qc, qerr := Apply(quiet, w.s, w.now, op)
	if !errors.Is(qerr, err) || qc.Outcome != c.Outcome || (op.Kind != OpGrant && len(qc.Entries) > 0) || !reflect.DeepEqual(qs.Bucket, ns.Bucket) {
		w.fail(t, "without a ledger: %+v %v, with: %+v %v", qc, qerr, c, err)
	}
	if !errors.Is(cerr, err) || cc.Outcome != c.Outcome || cc.Replayed != c.Replayed {
		w.fail(t, "cleanup changed a decision: %+v %v, without cleanup %+v %v", cc, cerr, c, err)
	}
	switch {
	case err != nil, c.Replayed, !c.Allowed:
		if !reflect.DeepEqual(ns, w.s) || len(c.Entries) > 0 {
			w.fail(t, "%v / replayed %v / denied changed the state: %+v -> %+v, %+v", err, c.Replayed, w.s, ns, c.Entries)
		}
	}
	if op.Kind == OpCharge && err == nil && !c.Replayed && c.Allowed != peek.Allowed {
		w.fail(t, "Look said %+v, the charge %+v", peek, c.Outcome)
	}
	if err == nil && !c.Replayed && c.Allowed {
		w.checkEntries(t, p, op, c, tokens, granted)
	}
	if op.ID != "" && err == nil && op.Kind != OpReset {
		// Replaying it at once returns the same outcome and changes nothing.
		rs, rc, rerr := Apply(p, ns, w.now, op)
		if (c.Allowed || op.Kind != OpCharge) && (rerr != nil || !rc.Replayed || rc.Outcome != c.Outcome || !reflect.DeepEqual(rs, ns)) {
			w.fail(t, "replay of %+v: %+v %v, first %+v", op, rc, rerr, c)
		}
	}
	for _, g := range ns.Grants {
		if g.Amount < 0 {
			w.fail(t, "grant below zero: %+v", g)
		}
	}
	if !c.Allowed && err == nil && op.Kind == OpCharge && c.RetryAfter < Inf {
		w.checkRetry(t, p, op.Amount, c.RetryAfter)
	}
	w.s, w.clean = ns, nc
}

// checkEntries checks that the entries chain from the balance before (tokens
// and grants as a Look saw them, plus expiring credits) to the outcome's, and
// that the operation's own entry is what it says.
func (w *walk) checkEntries(t *testing.T, p Policy, op Op, c Change, tokens, granted int64) {
	t.Helper()
	var expired, plan int64
	var own []Entry
	for _, e := range c.Entries {
		switch e.Kind {
		case OpExpire:
			expired += e.Amount
		case OpPlan:
			plan += e.Amount
		default:
			own = append(own, e)
		}
	}
	before := AddSat(AddSat(tokens, granted), 0)
	after := AddSat(c.Remaining, c.Granted)
	if len(c.Entries) > 0 {
		last := c.Entries[len(c.Entries)-1]
		if last.Balance != after || last.Granted != c.Granted {
			w.fail(t, "last entry %+v, outcome %+v", last, c.Outcome)
		}
		for i := 1; i < len(c.Entries); i++ {
			if c.Entries[i].Balance != AddSat(c.Entries[i-1].Balance, c.Entries[i].Amount) {
				w.fail(t, "entries do not chain: %+v", c.Entries)
			}
		}
	}
	var sum int64
	for _, e := range own {
		sum += e.Amount
	}
	if after-before != sum || len(own) > 1 {
		w.fail(t, "op entries %+v add to %d, the balance moved %d -> %d (expired %d, plan %d)", own, sum, before, after, expired, plan)
	}
	switch op.Kind {
	case OpCharge, OpDebit:
		if len(own) != 1 || own[0].Amount != -op.Amount && after > -1<<62 {
			w.fail(t, "charge of %d: %+v", op.Amount, own)
		}
	case OpGrant:
		if len(own) != 1 || own[0].Amount != op.Amount {
			w.fail(t, "grant of %d: %+v", op.Amount, own)
		}
	case OpRefund:
		if sum < 0 || sum > op.Amount {
			w.fail(t, "refund of %d: %+v", op.Amount, own)
		}
	}
}

// checkRetry checks that a cost denied with RetryAfter r is allowed r later
// and not a moment before.
func (w *walk) checkRetry(t *testing.T, p Policy, cost int64, r time.Duration) {
	t.Helper()
	if o := Look(p, w.s, w.now.Add(r), cost); !o.Allowed {
		w.fail(t, "cost %d still denied RetryAfter %v later: %+v", cost, r, o)
	}
	if r > 0 {
		if o := Look(p, w.s, w.now.Add(r-time.Nanosecond), cost); o.Allowed {
			w.fail(t, "cost %d allowed before RetryAfter %v: %+v", cost, r, o)
		}
	}
}

// FuzzAccount drives random sequences of every operation (with request IDs
// reused, clock moves across refills, period ends and grant expiries, plan
// changes, cleanup) and checks the invariants after each: the entries add up
// to the change of the balance, no grant goes below zero, a denied operation
// and a replay change nothing, a replay returns the first outcome, Look
// agrees with a charge, RetryAfter is exact, and cleanup changes no decision.
func FuzzAccount(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("settle the debt, grant, charge twice; expire; plan"))
	f.Add(slices.Repeat([]byte{3, 9, 1, 7, 200, 4, 2, 11, 5, 0, 8}, 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		month := Calendar(Month, time.UTC, time.Date(2026, 1, 31, 9, 0, 0, 0, time.UTC))
		w := &walk{data: data, now: t0, pols: []Policy{
			{Capacity: 100, Refill: 30, Schedule: Grid(time.Hour)},
			{Capacity: 250, Refill: 250, Schedule: month},
			{Capacity: 40, Refill: 40, Schedule: month},
		}}
		for len(w.data) > 0 {
			w.step(t)
		}
	})
}

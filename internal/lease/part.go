package lease

import (
	"errors"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// The engine locks a key's row (a placeholder of the bucket table of the
// lease's storage, whose balance is never touched) as any bucket's, in
// global order, and every writer of a key's leases holds that lock first:
// counting a key's live leases, then adding one, is exact under any
// concurrency and in any batch. A Part reads the leases of its charges' keys
// after the locks, in the first round trip; decides each operation in
// arrival order, each seeing the ones before it (the attempt's state of a
// key is shared by every Part); and writes the difference before COMMIT.

// ErrRetry fails an operation whose key's leases were read before its row
// was locked: a cleanup deleted the row between the INSERT and the lock,
// and the engine locked it anew after the reads. Nothing was decided; the
// caller runs the operation again (its next try reads after the lock).
var ErrRetry = errors.New("pgratelimit: a lease key's row was deleted while being locked; run the operation again")

// Part decides the lease operations of one kind under one limit. It is
// comparable: a request's charges name it (engine.Charge.Part), and the
// engine hands a Part all of its attempt's charges at once.
type Part struct {
	Kind  Kind
	Limit Limit
}

// stateKey is the owner of the state every Part of an attempt shares.
type stateKey struct{}

// state is what an attempt's Parts know of its keys' leases.
type state struct {
	keys    map[engine.Row]*keyState
	tokens  []int64 // fencing tokens read, in order
	used    int     // tokens given to new leases
	written bool
}

// keyState is a key's leases: as read, and as decided so far.
type keyState struct {
	read   []Lease
	leases []Lease
	held   bool // the key's row was locked when its leases were read
	dirty  bool // leases differ from read
	notify bool // a release freed units of a full key
}

func (k *keyState) current() []Lease {
	if k.dirty {
		return k.leases
	}
	return k.read
}

func stateOf(a *engine.Attempt) *state {
	return a.Local(stateKey{}, func() any { return &state{keys: make(map[engine.Row]*keyState)} }).(*state)
}

// StatementsOf are the lease statements of storage s.
func StatementsOf(s engine.Storage) *sqlgen.LeaseStatements {
	if s == engine.Ephemeral {
		return &sqlgen.EphemeralLeases
	}
	return &sqlgen.Leases
}

// Read returns the statements that read the leases of cs's keys that no
// Part of a has read yet (one per table, in a's shape) and, for
// acquisitions, their fencing tokens, after the locks.
func (p Part) Read(a *engine.Attempt, cs []engine.Charge) []engine.Stmt {
	st := stateOf(a)
	var todo [2][]engine.Row // by storage
	for _, c := range cs {
		if _, ok := st.keys[c.Row]; !ok {
			st.keys[c.Row] = &keyState{}
			todo[c.Row.Storage] = append(todo[c.Row.Storage], c.Row)
		}
	}
	var stmts []engine.Stmt
	for s, rows := range todo {
		if len(rows) == 0 {
			continue
		}
		vals := make([][]any, len(rows))
		for i, r := range rows {
			vals[i] = []any{r.Prefix, r.Key}
		}
		stmts = append(stmts, a.Shape().Values(StatementsOf(engine.Storage(s)).Read, vals, st.scanLeases(a, engine.Storage(s), rows))...)
	}
	if p.Kind == Acquire {
		stmts = append(stmts, engine.Stmt{SQL: sqlgen.LeaseTokens, Args: []any{int64(len(cs))}, Scan: st.scanTokens})
	}
	return stmts
}

// scanLeases reads the leases of rows, of storage s, and notes whether a
// held each row's lock then (the locks are read before, in the same
// pipeline).
func (st *state) scanLeases(a *engine.Attempt, s engine.Storage, rows []engine.Row) func(engine.RowScanner) error {
	return func(rs engine.RowScanner) error {
		for _, r := range rows {
			st.keys[r].held = a.Held(r)
		}
		var (
			r engine.Row
			l Lease
		)
		dest := []any{&r.Prefix, &r.Key, &l.ID, &l.Weight, &l.Token, &l.AcquiredAt, &l.ExpiresAt}
		for rs.Next() {
			r, l = engine.Row{Storage: s}, Lease{}
			if err := rs.Scan(dest...); err != nil {
				return err
			}
			if ks := st.keys[r]; ks != nil {
				ks.read = append(ks.read, l)
			}
		}
		return rs.Err()
	}
}

func (st *state) scanTokens(rs engine.RowScanner) error {
	for rs.Next() {
		var t int64
		if err := rs.Scan(&t); err != nil {
			return err
		}
		st.tokens = append(st.tokens, t)
	}
	return rs.Err()
}

// Decide decides c, an operation of q, on its key's leases as decided so
// far; it changes nothing. Its outcome, or the lease an error found, goes to
// q's Call.
func (p Part) Decide(a *engine.Attempt, q *engine.Request, c engine.Charge) (account.Outcome, error) {
	st, call := stateOf(a), callOf(q)
	ks := st.keys[c.Row]
	switch {
	case call == nil:
		return account.Outcome{}, errors.New("pgratelimit: a lease operation without its call") // a bug of ours
	case ks == nil || !ks.held:
		return account.Outcome{}, ErrRetry
	case p.Kind == Acquire && st.used >= len(st.tokens):
		return account.Outcome{}, errors.New("pgratelimit: no fencing token left for a lease") // a bug of ours
	}
	_, out, err := Apply(p.Limit, ks.current(), a.Now(), p.op(call, c, 0))
	call.put(c.Row, out)
	if err != nil {
		return account.Outcome{}, err
	}
	return account.Outcome{Allowed: out.Allowed, Limit: p.Limit.Max, Remaining: out.Remaining(p.Limit),
		RetryAfter: out.RetryAfter, ResetAfter: out.ResetAfter}, nil
}

// Take applies c, decided and allowed with the rest of q, to its key's
// leases: a new lease gets the next fencing token.
func (p Part) Take(a *engine.Attempt, q *engine.Request, c engine.Charge) {
	st, call := stateOf(a), callOf(q)
	ks, now := st.keys[c.Row], a.Now()
	cur := ks.current()
	op := p.op(call, c, 0)
	if p.Kind == Acquire {
		if _, out, _ := Apply(p.Limit, cur, now, op); out.Replayed {
			call.put(c.Row, out)
			return
		}
		op.Token = st.tokens[st.used]
		st.used++
	}
	next, out, err := Apply(p.Limit, cur, now, op)
	if err != nil {
		return // Decide allowed it on the same leases: cannot happen
	}
	if p.Kind == Release && out.Lease.ID != "" && full(p.Limit, cur, now) {
		ks.notify = true
	}
	ks.leases, ks.dirty = next, true
	call.put(c.Row, out)
}

// full says whether a key with leases ls had fewer units free at now than
// its largest live lease's weight: one its holders' likes may wait for, so
// that a release wakes waiters (see Write).
func full(lim Limit, ls []Lease, now time.Time) bool {
	var big int64
	for _, l := range Live(ls, now) {
		big = max(big, l.Weight)
	}
	return lim.Max-Held(ls, now) < big
}

func (p Part) op(call *Call, c engine.Charge, token int64) Op {
	return Op{Kind: p.Kind, ID: call.ID, Weight: c.Cost, Token: token}
}

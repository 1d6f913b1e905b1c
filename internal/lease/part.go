package lease

import (
	"errors"
	"slices"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// A key's leases are the leases column of its row in the bucket table of
// the lease's storage (a row whose balance is never touched). The engine
// inserts and locks that row as any bucket's, in global order, and reads
// the column in the locking statement: counting a key's live leases, then
// adding one, is exact under any concurrency and in any batch. A Part
// decides each operation in arrival order, each seeing the ones before it
// (the attempt's state of a key is shared by every Part), and writes the
// keys' new leases before COMMIT.

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

// keyState is a key's leases as decided so far.
type keyState struct {
	leases []Lease
	dirty  bool // leases differ from the row's
	notify bool // a release freed units of a full key
}

func stateOf(a *engine.Attempt) *state {
	return a.Local(stateKey{}, func() any { return &state{keys: make(map[engine.Row]*keyState, len(a.Rows()))} }).(*state)
}

// key returns r's state, decoding the leases a read with r's lock the
// first time.
func (st *state) key(a *engine.Attempt, r engine.Row) (*keyState, error) {
	if ks := st.keys[r]; ks != nil {
		return ks, nil
	}
	ls, err := Decode(a.Data(r))
	if err != nil {
		return nil, err
	}
	ks := &keyState{leases: ls}
	st.keys[r] = ks
	return ks, nil
}

// StatementsOf are the lease statements of storage s.
func StatementsOf(s engine.Storage) *sqlgen.LeaseStatements {
	if s == engine.Ephemeral {
		return &sqlgen.EphemeralLeases
	}
	return &sqlgen.Leases
}

// Read returns, for acquisitions, the statement that reads a fencing token
// per charge of cs (the leases come with the locks).
func (p Part) Read(a *engine.Attempt, cs []engine.Charge) []engine.Stmt {
	if p.Kind != Acquire {
		return nil
	}
	st := stateOf(a)
	st.tokens = slices.Grow(st.tokens, len(cs))
	return []engine.Stmt{{SQL: sqlgen.LeaseTokens, Args: []any{int64(len(cs))}, Scan: st.scanTokens}}
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
	st, call := stateOf(a), callOf(c)
	switch {
	case call == nil:
		return account.Outcome{}, errors.New("pgratelimit: a lease operation without its call") // a bug of ours
	case !a.Held(c.Row):
		return account.Outcome{}, errors.New("pgratelimit: a lease operation on a key whose row is not locked") // a bug of ours
	case p.Kind == Acquire && st.used >= len(st.tokens):
		return account.Outcome{}, errors.New("pgratelimit: no fencing token left for a lease") // a bug of ours
	}
	ks, err := st.key(a, c.Row)
	if err != nil {
		return account.Outcome{}, err
	}
	_, out, err := Apply(p.Limit, ks.leases, a.Now(), p.op(call, c))
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
	st, call := stateOf(a), callOf(c)
	ks, now := st.keys[c.Row], a.Now() // Decide made it
	op := p.op(call, c)
	if p.Kind == Acquire {
		if slices.ContainsFunc(ks.leases, func(l Lease) bool { return l.ID == op.ID && l.Live(now) }) {
			return // a replay, as Decide found: it changes nothing
		}
		op.Token = st.tokens[st.used]
		st.used++
	}
	next, out, err := Apply(p.Limit, ks.leases, now, op)
	if err != nil {
		return // Decide allowed it on the same leases: cannot happen
	}
	if p.Kind == Release && out.Lease.ID != "" && full(p.Limit, ks.leases, now) {
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
	for _, l := range ls {
		if l.Live(now) {
			big = max(big, l.Weight)
		}
	}
	return lim.Max-Held(ls, now) < big
}

func (p Part) op(call *Call, c engine.Charge) Op {
	return Op{Kind: p.Kind, ID: call.ID, Weight: c.Cost}
}

// ReadList reads the leases of row r's column (expired ones too: see Live)
// into ls, and the check's clock (clock, a Clock's Param, or the
// database's) into now.
func ReadList(r engine.Row, clock any, ls *[]Lease, now *time.Time) engine.Stmt {
	return engine.Stmt{SQL: StatementsOf(r.Storage).List, Args: []any{r.Prefix, r.Key, clock}, Scan: func(rs engine.RowScanner) error {
		for rs.Next() {
			var col *string
			if err := rs.Scan(&col, now); err != nil {
				return err
			}
			if col != nil {
				got, err := Decode(*col)
				if err != nil {
					return err
				}
				*ls = append(*ls, got...)
			}
		}
		return rs.Err()
	}}
}

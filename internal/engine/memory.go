package engine

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
)

// Memory keeps accounts in this process's memory and decides requests on
// them as a transaction on the tables would: the same account model and the
// same decisions (decideOne), each request all or nothing, one at a time in
// arrival order. It is for the tests of code that uses a limiter, without a
// database: one process, no caller's transactions, no Parts (leases) or
// Observers (alerts), nothing kept across restarts. Safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	accounts map[Row]*account.State
	ledger   map[Row][]LedgerRow
	ids      int64 // the last grant's and ledger row's
}

// ErrNotInMemory is the error of a request Memory cannot decide: a Part's
// or an Observer's charge.
var ErrNotInMemory = errors.New("pgratelimit: leases and alerts need a database: an in-memory client decides only balances")

// NewMemory returns an empty Memory.
func NewMemory() *Memory {
	return &Memory{accounts: make(map[Row]*account.State), ledger: make(map[Row][]LedgerRow)}
}

// now is the clock of set: its Clock, else the process's.
func now(set Settings) time.Time {
	if set.Clock != nil {
		return set.Clock.Now().Truncate(time.Microsecond).UTC()
	}
	return time.Now().Truncate(time.Microsecond).UTC()
}

// Run decides q at set's clock, and keeps what it changed.
func (m *Memory) Run(q *Request, set Settings) error {
	for _, c := range q.Charges {
		if c.Part != nil || c.Observer != nil {
			return ErrNotInMemory
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &Attempt{Plan: &Plan{set: set}, ctx: q.Ctx, state: make(map[Row]*account.State, len(q.Charges)), now: now(set)}
	for _, c := range q.Charges {
		a.state[c.Row] = m.copyOf(c.Row)
	}
	if q.Kind == account.OpGrant {
		m.ids++
		a.grantID = m.ids
	}
	a.decideOne(q)
	if q.Err != nil || !q.Allowed {
		return q.Result()
	}
	for r, st := range a.state {
		m.accounts[r] = st
	}
	for _, r := range a.resets {
		m.accounts[r].Bucket = account.Bucket{} // its row deleted: full again
	}
	for _, e := range a.ledger {
		m.ids++
		r := Row{Storage: Durable, Prefix: e[0].(string), Key: e[1].(string)} // a ledger needs Durable
		m.ledger[r] = append(m.ledger[r], LedgerRow{ID: m.ids, At: e[2].(time.Time), Amount: e[3].(int64), Kind: e[4].(string),
			RequestID: e[5].(string), Balance: e[6].(int64), GrantsAmount: e[7].(int64), Granted: e[8].(int64)})
	}
	return q.Result()
}

// copyOf is a copy of r's account (an empty one for a key never seen).
func (m *Memory) copyOf(r Row) *account.State {
	st := &account.State{}
	if o := m.accounts[r]; o != nil {
		st.Bucket, st.Grants, st.Records = o.Bucket, slices.Clone(o.Grants), maps.Clone(o.Records)
	}
	return st
}

// Read returns a copy of r's account and the clock of set, as a read of
// the tables would.
func (m *Memory) Read(r Row, set Settings) (account.State, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return *m.copyOf(r), now(set)
}

// Ledger returns r's ledger rows since since, oldest first.
func (m *Memory) Ledger(r Row, since time.Time) []LedgerRow {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []LedgerRow
	for _, e := range m.ledger[r] {
		if !e.At.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

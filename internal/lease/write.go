package lease

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Write returns the statements that write what a's decisions did to its
// keys' leases, the first time a Part of a is asked (the state is shared):
// per table, the leases released (deleted), those acquired or extended
// (upserted), the touch of their keys' rows (see sqlgen.LeaseStatements),
// then the notifications of releases from full keys, which PostgreSQL
// delivers at COMMIT, only if it commits.
func (p Part) Write(a *engine.Attempt) []engine.Stmt {
	st := stateOf(a)
	if st.written {
		return nil
	}
	st.written = true
	var w [2]writes // by storage
	var notify [][]any
	for _, r := range a.Rows() { // lock order: the same statements for the same work
		ks := st.keys[r]
		if ks == nil || !ks.dirty {
			continue
		}
		w[r.Storage].add(r, ks)
		if ks.notify {
			notify = append(notify, []any{sqlgen.LeaseChannel(r.Prefix), r.Key})
		}
	}
	var stmts []engine.Stmt
	sh := a.Shape()
	for s := range w {
		ls, ws := StatementsOf(engine.Storage(s)), &w[s]
		if len(ws.deletes) > 0 {
			stmts = append(stmts, sh.Values(ls.Delete, ws.deletes, nil)...)
		}
		if len(ws.upserts) > 0 {
			stmts = append(stmts, sh.Values(ls.Write, ws.upserts, nil)...)
		}
		if len(ws.touches) > 0 {
			stmts = append(stmts, sh.Values(ls.Touch, ws.touches, nil)...)
		}
	}
	if len(notify) > 0 {
		stmts = append(stmts, sh.Values(sqlgen.LeaseNotify, notify, nil)...)
	}
	return stmts
}

// writes are the rows of a table's lease statements.
type writes struct{ deletes, upserts, touches [][]any }

// add adds the difference between the leases of r as read and as decided.
func (w *writes) add(r engine.Row, ks *keyState) {
	var last time.Time // the latest expiry written
	for _, o := range ks.read {
		if !containsID(ks.leases, o.ID) {
			w.deletes = append(w.deletes, []any{r.Prefix, r.Key, o.ID})
		}
	}
	for _, l := range ks.leases {
		if i := indexID(ks.read, l.ID); i >= 0 && same(ks.read[i], l) {
			continue
		}
		w.upserts = append(w.upserts, []any{r.Prefix, r.Key, l.ID, l.Weight, l.Token, l.AcquiredAt, l.ExpiresAt})
		if l.ExpiresAt.After(last) {
			last = l.ExpiresAt
		}
	}
	if !last.IsZero() {
		w.touches = append(w.touches, []any{r.Prefix, r.Key, roundUp(last)})
	}
}

// roundUp rounds t up to account.ExpiryGranularity, as bucket expiries
// are, so that the lock row's expiry changes rarely.
func roundUp(t time.Time) time.Time {
	if r := t.Truncate(account.ExpiryGranularity); !r.Equal(t) {
		return r.Add(account.ExpiryGranularity)
	}
	return t
}

func indexID(ls []Lease, id string) int {
	for i, l := range ls {
		if l.ID == id {
			return i
		}
	}
	return -1
}

// same says whether a and b are the same stored lease.
func same(a, b Lease) bool {
	return a.ID == b.ID && a.Weight == b.Weight && a.Token == b.Token &&
		a.AcquiredAt.Equal(b.AcquiredAt) && a.ExpiresAt.Equal(b.ExpiresAt)
}

func containsID(ls []Lease, id string) bool { return indexID(ls, id) >= 0 }

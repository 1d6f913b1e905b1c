package lease

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Write returns the statements that write what a's decisions did to its
// keys' leases, the first time a Part of a is asked (the state is shared):
// per table, one UPDATE of the changed keys' rows (their leases, and an
// expiry that keeps each row while its leases are
// remembered); and it has the engine notify the releases from full keys
// (delivered at COMMIT, only if it commits).
func (p Part) Write(a *engine.Attempt) []engine.Stmt {
	st := stateOf(a)
	if st.written {
		return nil
	}
	st.written = true
	var (
		rows   [2][][]any // by storage
		cells  []any      // every row's values, in one allocation
		prefix any        // the last row's prefix, boxed once for its rows
	)
	now, all := a.Now(), a.Rows()
	for _, r := range all { // lock order: the same statements for the same work
		ks := st.keys[r]
		if ks == nil || !ks.dirty {
			continue
		}
		col := Encode(ks.leases) // as Apply left them: less those forgotten at now
		keep := Remembered(ks.leases)
		if keep.Before(now) {
			keep = now
		}
		if cells == nil {
			cells = make([]any, 0, 4*len(all))
		}
		if p, _ := prefix.(string); prefix == nil || p != r.Prefix {
			prefix = r.Prefix
		}
		if rows[r.Storage] == nil {
			rows[r.Storage] = make([][]any, 0, len(all))
		}
		i := len(cells)
		cells = append(cells, prefix, r.Key, col, roundUp(keep))
		rows[r.Storage] = append(rows[r.Storage], cells[i:len(cells):len(cells)])
		if ks.notify {
			a.Notify(sqlgen.LeaseChannel(r.Prefix), r.Key)
		}
	}
	var stmts []engine.Stmt
	sh := a.Shape()
	for s, vals := range rows {
		if len(vals) > 0 {
			stmts = append(stmts, sh.Values(StatementsOf(engine.Storage(s)).Write, vals, nil)...)
		}
	}
	return stmts
}

// roundUp rounds t up to account.ExpiryGranularity, as bucket expiries
// are, so that the row's expiry changes rarely.
func roundUp(t time.Time) time.Time {
	if r := t.Truncate(account.ExpiryGranularity); !r.Equal(t) {
		return r.Add(account.ExpiryGranularity)
	}
	return t
}

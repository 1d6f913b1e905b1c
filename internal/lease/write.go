package lease

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Write has the engine write what a's decisions did to its keys' leases,
// the first time a Part of a is asked (the state is shared): each changed
// key's leases column, and an expiry that keeps its row while its leases
// are remembered (engine.Attempt.SetData); and notify the releases from
// full keys (delivered at COMMIT, only if it commits). It adds no
// statement of its own.
func (p Part) Write(a *engine.Attempt) []engine.Stmt {
	st := stateOf(a)
	if st.written {
		return nil
	}
	st.written = true
	now := a.Now()
	for _, r := range a.Rows() { // lock order: the same statements for the same work
		ks := st.keys[r]
		if ks == nil || !ks.dirty {
			continue
		}
		keep := Remembered(ks.leases)
		if keep.Before(now) {
			keep = now
		}
		a.SetData(r, Encode(ks.leases), roundUp(keep)) // as Apply left them: less those forgotten at now
		if ks.notify {
			a.Notify(sqlgen.LeaseChannel(r.Prefix), r.Key)
		}
	}
	return nil
}

// roundUp rounds t up to account.ExpiryGranularity, as bucket expiries
// are, so that the row's expiry changes rarely.
func roundUp(t time.Time) time.Time {
	if r := t.Truncate(account.ExpiryGranularity); !r.Equal(t) {
		return r.Add(account.ExpiryGranularity)
	}
	return t
}

package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// leaseModel is a semaphore's keys as the README says: each key's leases by
// ID, with weight and expiry; a lease expired at least one TTL ago is
// forgotten.
type leaseModel struct {
	max  int64
	ttl  time.Duration
	keys map[string]map[string]modelLease
}

type modelLease struct {
	weight int64
	exp    time.Time
}

// leases returns key's leases at now, less those forgotten.
func (m *leaseModel) leases(key string, now time.Time) map[string]modelLease {
	ls := m.keys[key]
	if ls == nil {
		ls = make(map[string]modelLease)
		m.keys[key] = ls
	}
	for id, l := range ls {
		if !now.Before(l.exp.Add(m.ttl)) {
			delete(ls, id)
		}
	}
	return ls
}

func (m *leaseModel) held(ls map[string]modelLease, now time.Time) int64 {
	var n int64
	for _, l := range ls {
		if now.Before(l.exp) {
			n += l.weight
		}
	}
	return n
}

// TestLeaseWalk drives random acquisitions (with lease IDs repeated as
// request IDs), releases, extensions, listings, clock moves and cleanups
// over a few keys, in both storages and both coalescing modes, and checks
// every answer against leaseModel.
func TestLeaseWalk(t *testing.T) {
	t.Parallel()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		for _, coalesce := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/coalesce=%v", storage, coalesce), func(t *testing.T) {
				t.Parallel()
				seed := uint64(time.Now().UnixNano())
				t.Logf("seed %d", seed)
				walkLeases(t, rand.New(rand.NewPCG(seed, 33)), storage, !coalesce)
			})
		}
	}
}

func walkLeases(t *testing.T, rng *rand.Rand, storage pgratelimit.Storage, perCheck bool) {
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock()
	prefix := fmt.Sprintf("walk-%s-%v", storage, perCheck)
	const ttl = 10 * time.Second
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: prefix, Max: 4, TTL: ttl, Storage: storage,
		Clock: clock.Now, DisableCoalescing: perCheck})
	m := &leaseModel{max: 4, ttl: ttl, keys: map[string]map[string]modelLease{}}
	keys := []string{"a", "b", "c"}
	for step := range 400 {
		key, id := keys[rng.IntN(len(keys))], fmt.Sprintf("id%d", rng.IntN(6))
		now := clock.Now()
		ls := m.leases(key, now)
		l, there := ls[id]
		live := there && now.Before(l.exp)
		where := fmt.Sprintf("step %d at +%v: key %s, lease %s", step, now.Sub(t0), key, id)
		switch op := rng.IntN(10); {
		case op < 4: // acquire
			w := int64(rng.IntN(3) + 1)
			r, err := s.Acquire(pgratelimit.WithRequestID(ctx, id), key, w)
			switch {
			case live && l.weight != w:
				require.ErrorIs(t, err, pgratelimit.ErrRequestMismatch, where)
			case live:
				require.NoError(t, err, where)
				require.True(t, r.Allowed, "%s: a replay", where)
				require.Equal(t, l.exp, r.Lease.ExpiresAt.UTC(), "%s: the same lease", where)
			case m.held(ls, now)+w <= m.max:
				require.NoError(t, err, where)
				require.True(t, r.Allowed, "%s: %d free", where, m.max-m.held(ls, now))
				require.Equal(t, id, r.Lease.ID, where)
				ls[id] = modelLease{weight: w, exp: now.Add(ttl)}
			default:
				require.NoError(t, err, where)
				require.False(t, r.Allowed, "%s: %d held, weight %d", where, m.held(ls, now), w)
				require.Equal(t, m.held(ls, now), r.Limit-r.Remaining, where)
			}
		case op < 6: // release
			err := s.Release(ctx, key, id)
			switch {
			case !there:
				require.NoError(t, err, where)
			case !live:
				require.ErrorIs(t, err, pgratelimit.ErrLeaseExpired, where)
			default:
				require.NoError(t, err, where)
				delete(ls, id)
			}
		case op < 7: // extend
			got, err := s.Extend(ctx, key, id)
			switch {
			case !there:
				require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound, where)
			case !live:
				require.ErrorIs(t, err, pgratelimit.ErrLeaseExpired, where)
			default:
				require.NoError(t, err, where)
				l.exp = now.Add(ttl)
				ls[id] = l
				require.Equal(t, l.exp, got.ExpiresAt.UTC(), where)
			}
		case op < 8: // list
			got, err := s.Leases(ctx, key)
			require.NoError(t, err, where)
			var ids, want []string
			for _, g := range got {
				ids = append(ids, g.ID)
			}
			for id, l := range ls {
				if now.Before(l.exp) {
					want = append(want, id)
				}
			}
			slices.Sort(ids)
			slices.Sort(want)
			require.Equal(t, want, ids, where)
		case op < 9: // cleanup: never changes an answer
			_, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now})
			require.NoError(t, err, where)
		default:
			clock.Add(time.Duration(rng.IntN(16)) * time.Second)
		}
	}
}

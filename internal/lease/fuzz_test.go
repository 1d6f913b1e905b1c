package lease

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// model is a key's leases the simplest way: each ID's weight and expiry,
// and whether it is there at all (remembered: expired less than a TTL
// ago).
type model struct {
	weight map[string]int64
	exp    map[string]time.Time
}

func (m *model) held(now time.Time) int64 {
	var n int64
	for id, w := range m.weight {
		if now.Before(m.exp[id]) {
			n += w
		}
	}
	return n
}

// FuzzLeases applies random sequences of acquisitions, releases, extensions
// and clock moves (forwards and back) to one key, checks every outcome
// against the model, and that live leases never hold more than Max units.
func FuzzLeases(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(3), uint8(5))
	f.Add([]byte{0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xa9}, uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, steps []byte, maxU, ttlS uint8) {
		lim := Limit{Max: int64(maxU%8) + 1, TTL: time.Duration(ttlS%20+1) * time.Second}
		m := &model{weight: map[string]int64{}, exp: map[string]time.Time{}}
		var ls []Lease
		now, token := t0, int64(0)
		for i, b := range steps {
			id := fmt.Sprintf("l%d", b>>5) // 8 IDs
			op := Op{ID: id}
			switch b & 3 {
			case 0, 1:
				token++
				op.Kind, op.Weight, op.Token = Acquire, min(int64(b>>2&3)+1, lim.Max), token
			case 2:
				op.Kind = Release
			case 3:
				op.Kind = Extend
			}
			next, out, err := Apply(lim, ls, now, op)
			checkModel(t, i, lim, m, now, op, out, err)
			ls = next
			if h := Held(ls, now); h > lim.Max && op.Kind == Acquire && out.Allowed && !out.Replayed {
				t.Fatalf("step %d: %d units held, max %d", i, h, lim.Max)
			}
			if got, want := Held(ls, now), m.held(now); got != want {
				t.Fatalf("step %d %+v: held %d, model %d", i, op, got, want)
			}
			// Move the clock by 0 to 7 seconds, sometimes back by one.
			switch d := time.Duration(b>>2&7) * time.Second; {
			case b&0x80 != 0 && b&0x40 != 0:
				now = now.Add(-time.Second)
			default:
				now = now.Add(d)
			}
		}
	})
}

// checkModel checks the outcome of op at now against the model, and applies
// op to the model.
func checkModel(t *testing.T, i int, lim Limit, m *model, now time.Time, op Op, out Outcome, err error) {
	t.Helper()
	for id, e := range m.exp {
		if !now.Before(e.Add(lim.TTL)) {
			delete(m.weight, id)
			delete(m.exp, id)
		}
	}
	w, there := m.weight[op.ID]
	live := there && now.Before(m.exp[op.ID])
	switch op.Kind {
	case Acquire:
		switch {
		case live && w != op.Weight:
			want(t, i, errors.Is(err, ErrMismatch), "mismatch", op, out, err)
		case live:
			want(t, i, err == nil && out.Allowed && out.Replayed, "replay", op, out, err)
		case m.held(now)+op.Weight <= lim.Max:
			want(t, i, err == nil && out.Allowed && !out.Replayed && out.Lease.Token == op.Token, "acquired", op, out, err)
			m.weight[op.ID], m.exp[op.ID] = op.Weight, now.Add(lim.TTL)
		default:
			want(t, i, err == nil && !out.Allowed && out.RetryAfter > 0, "denied", op, out, err)
		}
	case Release:
		switch {
		case !there:
			want(t, i, err == nil && out.Allowed, "not held", op, out, err)
		case !live:
			want(t, i, errors.Is(err, ErrExpired), "expired", op, out, err)
		default:
			want(t, i, err == nil && out.Allowed, "released", op, out, err)
			delete(m.weight, op.ID)
			delete(m.exp, op.ID)
		}
	case Extend:
		switch {
		case !there:
			want(t, i, errors.Is(err, ErrNotFound), "not found", op, out, err)
		case !live:
			want(t, i, errors.Is(err, ErrExpired), "expired", op, out, err)
		default:
			want(t, i, err == nil && out.Allowed, "extended", op, out, err)
			if e := now.Add(lim.TTL); e.After(m.exp[op.ID]) {
				m.exp[op.ID] = e
			}
		}
	}
}

func want(t *testing.T, i int, ok bool, what string, op Op, out Outcome, err error) {
	t.Helper()
	if !ok {
		t.Fatalf("step %d %+v: want %s, got %+v, %v", i, op, what, out, err)
	}
}

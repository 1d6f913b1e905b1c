package lease

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// apply applies op and fails the test on an unexpected error.
func apply(t *testing.T, lim Limit, ls []Lease, now time.Time, op Op) ([]Lease, Outcome) {
	t.Helper()
	next, out, err := Apply(lim, ls, now, op)
	if err != nil {
		t.Fatalf("%+v: %v", op, err)
	}
	return next, out
}

func TestAcquireUpToMax(t *testing.T) {
	lim := Limit{Max: 3, TTL: 10 * time.Second}
	var ls []Lease
	for i, w := range []int64{1, 2} {
		var out Outcome
		ls, out = apply(t, lim, ls, at(time.Duration(i)*time.Second), Op{Kind: Acquire, ID: string(rune('a' + i)), Weight: w, Token: int64(i + 1)})
		if !out.Allowed || out.Lease.Weight != w || out.Lease.Token != int64(i+1) {
			t.Fatalf("acquire %d: %+v", i, out)
		}
	}
	if got := Held(ls, at(time.Second)); got != 3 {
		t.Fatalf("held %d, want 3", got)
	}
	// Full: denied until a's lease expires at 10s (it frees 1 unit, enough).
	next, out := apply(t, lim, ls, at(2*time.Second), Op{Kind: Acquire, ID: "c", Weight: 1, Token: 3})
	if out.Allowed || out.Held != 3 || out.RetryAfter != 8*time.Second || out.Remaining(lim) != 0 || len(next) != 2 {
		t.Fatalf("denied: %+v", out)
	}
	// Weight 3 needs both to expire: b's at 11s.
	if _, out = apply(t, lim, ls, at(2*time.Second), Op{Kind: Acquire, ID: "c", Weight: 3}); out.RetryAfter != 9*time.Second {
		t.Fatalf("weight 3 retry after %s, want 9s", out.RetryAfter)
	}
	// At 10s a's lease no longer counts.
	if _, out = apply(t, lim, ls, at(10*time.Second), Op{Kind: Acquire, ID: "c", Weight: 1, Token: 3}); !out.Allowed || out.Held != 3 {
		t.Fatalf("after a expired: %+v", out)
	}
}

func TestReplayAndReacquire(t *testing.T) {
	lim := Limit{Max: 1, TTL: 10 * time.Second}
	ls, first := apply(t, lim, nil, at(0), Op{Kind: Acquire, ID: "req", Weight: 1, Token: 7})
	next, again := apply(t, lim, ls, at(5*time.Second), Op{Kind: Acquire, ID: "req", Weight: 1, Token: 8})
	if !again.Allowed || !again.Replayed || again.Lease != first.Lease || len(next) != 1 {
		t.Fatalf("replay: %+v", again)
	}
	if _, _, err := Apply(lim, ls, at(5*time.Second), Op{Kind: Acquire, ID: "req", Weight: 2}); !errors.Is(err, ErrMismatch) {
		t.Fatalf("another weight: %v", err)
	}
	// After the TTL the same ID acquires anew, with a new token.
	next, anew := apply(t, lim, ls, at(10*time.Second), Op{Kind: Acquire, ID: "req", Weight: 1, Token: 9})
	if !anew.Allowed || anew.Replayed || anew.Lease.Token != 9 || len(next) != 1 || !anew.Lease.AcquiredAt.Equal(at(10*time.Second)) {
		t.Fatalf("anew: %+v %v", anew, next)
	}
}

func TestReleaseAndExtend(t *testing.T) {
	lim := Limit{Max: 2, TTL: 10 * time.Second}
	ls, _ := apply(t, lim, nil, at(0), Op{Kind: Acquire, ID: "a", Weight: 2, Token: 1})

	ext, out := apply(t, lim, ls, at(4*time.Second), Op{Kind: Extend, ID: "a"})
	if !out.Lease.ExpiresAt.Equal(at(14 * time.Second)) {
		t.Fatalf("extended to %s", out.Lease.ExpiresAt)
	}
	if _, _, err := Apply(lim, ext, at(14*time.Second), Op{Kind: Extend, ID: "a"}); !errors.Is(err, ErrExpired) {
		t.Fatalf("extend after expiry: %v", err)
	}
	if _, out, err := Apply(lim, ext, at(15*time.Second), Op{Kind: Release, ID: "a"}); !errors.Is(err, ErrExpired) || out.Lease.Weight != 2 {
		t.Fatalf("release after expiry: %v %+v", err, out)
	}
	if _, _, err := Apply(lim, ext, at(5*time.Second), Op{Kind: Extend, ID: "b"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend unknown: %v", err)
	}

	rel, out := apply(t, lim, ext, at(5*time.Second), Op{Kind: Release, ID: "a"})
	if !out.Allowed || out.Held != 0 || len(rel) != 0 || out.Lease.ID != "a" {
		t.Fatalf("release: %+v", out)
	}
	again, out := apply(t, lim, rel, at(5*time.Second), Op{Kind: Release, ID: "a"})
	if !out.Allowed || out.Lease.ID != "" || len(again) != 0 {
		t.Fatalf("release again: %+v", out)
	}
	if ls[0].ExpiresAt != at(10*time.Second) {
		t.Fatal("Apply changed its input")
	}
}

func TestExtendNeverShortens(t *testing.T) {
	ls, _ := apply(t, Limit{Max: 1, TTL: time.Hour}, nil, at(0), Op{Kind: Acquire, ID: "a", Weight: 1})
	_, out := apply(t, Limit{Max: 1, TTL: time.Second}, ls, at(time.Second), Op{Kind: Extend, ID: "a"})
	if !out.Lease.ExpiresAt.Equal(at(time.Hour)) {
		t.Fatalf("extended to %s", out.Lease.ExpiresAt)
	}
}

func TestLoweredMax(t *testing.T) {
	ls, _ := apply(t, Limit{Max: 5, TTL: time.Minute}, nil, at(0), Op{Kind: Acquire, ID: "a", Weight: 5})
	_, out := apply(t, Limit{Max: 2, TTL: time.Minute}, ls, at(time.Second), Op{Kind: Acquire, ID: "b", Weight: 1})
	if out.Allowed || out.Remaining(Limit{Max: 2}) != 0 || out.RetryAfter != 59*time.Second {
		t.Fatalf("%+v", out)
	}
}

// An expired lease is remembered for one TTL (ErrExpired), then forgotten
// as if never acquired, whatever was written in between.
func TestForgetAfterOneTTL(t *testing.T) {
	lim := Limit{Max: 2, TTL: 10 * time.Second}
	ls, _ := apply(t, lim, nil, at(0), Op{Kind: Acquire, ID: "a", Weight: 1, Token: 1})
	for _, d := range []time.Duration{10 * time.Second, 19 * time.Second} {
		if _, _, err := Apply(lim, ls, at(d), Op{Kind: Release, ID: "a"}); !errors.Is(err, ErrExpired) {
			t.Fatalf("release at %v: %v, want ErrExpired", d, err)
		}
	}
	if _, out, err := Apply(lim, ls, at(20*time.Second), Op{Kind: Release, ID: "a"}); err != nil || !out.Allowed || out.Lease.ID != "" {
		t.Fatalf("release one TTL after expiry: %+v, %v; want not held", out, err)
	}
	if _, _, err := Apply(lim, ls, at(20*time.Second), Op{Kind: Extend, ID: "a"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend one TTL after expiry: %v, want ErrNotFound", err)
	}
	next, _ := apply(t, lim, ls, at(25*time.Second), Op{Kind: Acquire, ID: "b", Weight: 1, Token: 2})
	if len(next) != 1 || next[0].ID != "b" {
		t.Fatalf("leases after an acquisition past a's memory: %+v", next)
	}
	if got := Remembered(next); !got.Equal(at(45 * time.Second)) {
		t.Fatalf("Remembered = %v, want one TTL past b's expiry", got)
	}
}

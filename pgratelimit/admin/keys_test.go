package admin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Keys pages through a prefix's keys by key order, Match selects by the
// start of the key (LIKE's wildcards are plain characters), and CountKeys
// counts the keys near and at their limit as their last check left them.
func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "p", Capacity: 10, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "q", Capacity: 10, Refill: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	costs := map[string]int64{"a%1": 1, "a%2": 9, "a_3": 10, "b": 10, "ab": 2, "é" + string(unicode.MaxRune): 1, "é\uffff": 1}
	for k, c := range costs {
		if _, err := l.AllowN(ctx, k, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Allow(ctx, "a%9"); err != nil {
		t.Fatal(err)
	}

	keys := func(f KeyFilter) []string {
		t.Helper()
		f.Prefix = "p"
		ks, err := Keys(ctx, pool, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, k := range ks {
			if k.Prefix != "p" || k.Tokens != 10-costs[k.Key] || k.RefilledAt.IsZero() || !k.ExpiresAt.After(k.RefilledAt) || k.Leases != 0 {
				t.Errorf("%+v", k)
			}
			out = append(out, k.Key)
		}
		return out
	}
	for _, c := range []struct {
		f    KeyFilter
		want []string
	}{
		{KeyFilter{}, []string{"a%1", "a%2", "a_3", "ab", "b", "é\uffff", "é" + string(unicode.MaxRune)}},
		{KeyFilter{Match: "é"}, []string{"é\uffff", "é" + string(unicode.MaxRune)}},
		{KeyFilter{Match: "é\uffff"}, []string{"é\uffff"}},
		{KeyFilter{Match: "a%"}, []string{"a%1", "a%2"}},
		{KeyFilter{Match: "a_"}, []string{"a_3"}},
		{KeyFilter{Match: "a", AfterKey: "a%2", Limit: 2}, []string{"a_3", "ab"}},
		{KeyFilter{AfterKey: "ab", Limit: 1}, []string{"b"}},
		{KeyFilter{Match: "c"}, nil},
	} {
		if got := keys(c.f); !slices.Equal(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.f, got, c.want)
		}
	}
	if ks, err := Keys(ctx, pool, KeyFilter{Prefix: "p", Storage: pgratelimit.Ephemeral}); err != nil || len(ks) != 0 {
		t.Errorf("ephemeral: %v, %v", ks, err)
	}

	c, err := CountKeys(ctx, pool, "p", pgratelimit.Durable, 1)
	if want := (KeyCounts{Keys: 7, Near: 3, AtLimit: 2}); err != nil || c != want {
		t.Errorf("CountKeys: %+v, %v, want %+v", c, err, want)
	}
}

// A Semaphore's key is a row with its leases, and no bucket.
func TestKeysLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "jobs", Max: 3, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r, err := s.Acquire(ctx, "k", 1); err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
	}
	ks, err := Keys(ctx, pool, KeyFilter{Prefix: "jobs"})
	if err != nil || len(ks) != 1 || ks[0].Key != "k" || ks[0].Leases != 2 || !ks[0].RefilledAt.IsZero() {
		t.Fatalf("%+v, %v", ks, err)
	}
	if c, err := CountKeys(ctx, pool, "jobs", pgratelimit.Durable, 1); err != nil || c != (KeyCounts{Keys: 1}) {
		t.Errorf("CountKeys: %+v, %v", c, err)
	}
}

func TestKeysArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := Keys(ctx, nil, KeyFilter{Prefix: "p"}); !errors.Is(err, pgratelimit.ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
	pool := testdb.Pool(t)
	for _, f := range []KeyFilter{{}, {Prefix: "p\x00"}, {Prefix: "p", Limit: -1}, {Prefix: "p", Limit: 10001},
		{Prefix: "p", Match: "\xff"}, {Prefix: "p", AfterKey: "a\x00"}, {Prefix: "p", Storage: 7}} {
		if _, err := Keys(ctx, pool, f); !errors.Is(err, pgratelimit.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", f, err)
		}
	}
	if _, err := CountKeys(ctx, pool, "", pgratelimit.Durable, 0); !errors.Is(err, pgratelimit.ErrInvalidArgument) {
		t.Errorf("CountKeys with no prefix: %v", err)
	}
}

func TestAbove(t *testing.T) {
	t.Parallel()
	top := string(unicode.MaxRune)
	for m, want := range map[string]string{"ab": "ac", "a\u00ff": "a\u0100", "a\ud7ff": "a\ue000", "a" + top: "b", "a" + top + top: "b"} {
		if got := above(m); got != want {
			t.Errorf("above(%q) = %q, want %q", m, got, want)
		}
	}
	for _, m := range []string{"", top, top + top} {
		if got := above(m); len(got) <= engine.MaxKeyLen || strings.Trim(got, top) != "" {
			t.Errorf("above(%q) = %q", m, got)
		}
	}
}

// Requests lists what the database remembers of a key's request IDs, in ID
// order and by pages; LookupRequest finds one, or says ErrUnknownRequest.
func TestRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "c", Capacity: 10, Refill: 10, Interval: time.Hour, Grants: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(pgratelimit.WithRequestID(ctx, "b-charge"), "k", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Settle(ctx, "k", "b-charge", 6); err != nil {
		t.Fatal(err)
	}
	g, err := l.Grant(pgratelimit.WithRequestID(ctx, "a-grant"), "k", 5, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(pgratelimit.WithRequestID(ctx, "c-other-key"), "other", 1); err != nil {
		t.Fatal(err)
	}

	rs, err := Requests(ctx, pool, RequestFilter{Prefix: "c", Key: "k"})
	if err != nil || len(rs) != 2 {
		t.Fatalf("%+v, %v", rs, err)
	}
	grant, charge := rs[0], rs[1]
	if grant.ID != "a-grant" || grant.Kind != "grant" || grant.Amount != 5 || grant.Grant.ID != g.ID || grant.Grant.Amount != 5 ||
		grant.Prefix != "c" || grant.Key != "k" || !grant.ExpiresAt.After(grant.At) {
		t.Errorf("grant: %+v", grant)
	}
	if charge.ID != "b-charge" || charge.Kind != "charge" || charge.Amount != 4 || !charge.Result.Allowed || charge.Result.Remaining != 6 ||
		!charge.Settled || charge.Actual != 6 || charge.Settlement.Remaining != 4 {
		t.Errorf("charge: %+v", charge)
	}
	if rs, err := Requests(ctx, pool, RequestFilter{Prefix: "c", Key: "k", AfterID: "a-grant", Limit: 1}); err != nil || len(rs) != 1 || rs[0].ID != "b-charge" {
		t.Errorf("the page after a-grant: %+v, %v", rs, err)
	}
	if got, err := LookupRequest(ctx, pool, "c", "k", "b-charge"); err != nil || got.Settled != charge.Settled || got.Actual != 6 || got.Result != charge.Result {
		t.Errorf("LookupRequest: %+v, %v", got, err)
	}
	if _, err := LookupRequest(ctx, pool, "c", "k", "c-other-key"); !errors.Is(err, pgratelimit.ErrUnknownRequest) {
		t.Errorf("another key's request: %v, want ErrUnknownRequest", err)
	}
	for _, f := range []RequestFilter{{Key: "k"}, {Prefix: "c"}, {Prefix: "c", Key: "k", Limit: -1}, {Prefix: "c", Key: "k", AfterID: "\xff"}} {
		if _, err := Requests(ctx, pool, f); !errors.Is(err, pgratelimit.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", f, err)
		}
	}
	if _, err := LookupRequest(ctx, pool, "c", "k", ""); !errors.Is(err, pgratelimit.ErrInvalidRequestID) {
		t.Errorf("no ID: %v, want ErrInvalidRequestID", err)
	}
}

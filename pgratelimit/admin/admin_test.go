package admin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Limiters record their policies once per process, at their first
// operation: two policies on one prefix are two rows, and a policy's row
// reads back as the limiter's Config.
func TestPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	cfgs := []pgratelimit.Config{
		{Prefix: "api", Capacity: 10, Refill: 1, Interval: time.Second},
		{Prefix: "api", Capacity: 50, Refill: 5, Interval: time.Second, Overrides: true}, // an instance that disagrees
		{Prefix: "quota", Capacity: 1000, Refill: 1000, Calendar: pgratelimit.Calendar{Every: pgratelimit.Month, Location: paris,
			Anchor: time.Date(2026, 1, 15, 0, 0, 0, 0, paris)}, Grants: true, Ledger: true, Storage: pgratelimit.Durable},
		{Prefix: "eph", Capacity: 5, Refill: 5, Interval: time.Minute, Storage: pgratelimit.Ephemeral},
	}
	client, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range cfgs {
		l, err := client.NewLimiter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // recorded once
			if _, err := l.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
		}
	}
	ps, err := admin.Policies(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != len(cfgs) {
		t.Fatalf("got %d policies, want %d: %+v", len(ps), len(cfgs), ps)
	}
	byPrefix := map[string]int{}
	for _, p := range ps {
		byPrefix[p.Prefix]++
		if p.FirstSeen.IsZero() || p.LastSeen.Before(p.FirstSeen) {
			t.Errorf("%+v: seen times", p)
		}
		cfg, err := p.Config()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, want := range cfgs {
			want.Calendar.Anchor = want.Calendar.Anchor.UTC()
			cfg.Calendar.Anchor = cfg.Calendar.Anchor.UTC()
			if cfg.Prefix == want.Prefix && cfg.Capacity == want.Capacity && cfg.Refill == want.Refill && cfg.Interval == want.Interval &&
				cfg.Storage == want.Storage && cfg.Grants == want.Grants && cfg.Ledger == want.Ledger && cfg.Overrides == want.Overrides &&
				cfg.Calendar.Every == want.Calendar.Every && cfg.Calendar.Anchor.Equal(want.Calendar.Anchor) &&
				(want.Calendar.Location == nil || cfg.Calendar.Location.String() == want.Calendar.Location.String()) {
				found = true
			}
		}
		if !found {
			t.Errorf("policy %+v reads back as %+v, not a limiter's", p, cfg)
		}
	}
	if byPrefix["api"] != 2 || ps[0].Prefix != "api" || ps[0].Same(ps[1]) {
		t.Errorf("two policies on api: %+v", ps)
	}
	if _, err := (admin.Policy{Prefix: "x", Schedule: "every fortnight"}).Config(); err == nil {
		t.Error("a schedule this release does not read: no error")
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	until := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	for _, prefix := range []string{"a", "b"} {
		l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: prefix, Capacity: 10, Refill: 1, Interval: time.Second, Overrides: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"k1", "k2", "k3"} {
			if _, err := l.SetOverride(ctx, key, pgratelimit.Override{Capacity: 20, Refill: 2, Until: until, Note: prefix + "/" + key}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.ClearOverride(ctx, "k3"); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(os []admin.Override) (out []string) {
		for _, o := range os {
			out = append(out, o.Prefix+"/"+o.Key)
		}
		return out
	}
	for _, c := range []struct {
		f    admin.OverrideFilter
		want []string
	}{
		{admin.OverrideFilter{}, []string{"a/k1", "a/k2", "b/k1", "b/k2"}},
		{admin.OverrideFilter{Prefix: "b"}, []string{"b/k1", "b/k2"}},
		{admin.OverrideFilter{Key: "k2"}, []string{"a/k2", "b/k2"}},
		{admin.OverrideFilter{Prefix: "a", Key: "k1"}, []string{"a/k1"}},
		{admin.OverrideFilter{Prefix: "a", Limit: 1}, []string{"a/k1"}},
		{admin.OverrideFilter{Prefix: "a", AfterKey: "k1"}, []string{"a/k2"}},
		{admin.OverrideFilter{Prefix: "c"}, nil},
	} {
		got, err := admin.Overrides(ctx, pool, c.f)
		if err != nil {
			t.Fatal(err)
		}
		if g := keys(got); len(g) != len(c.want) || len(g) > 0 && g[0] != c.want[0] || len(g) > 1 && g[len(g)-1] != c.want[len(c.want)-1] {
			t.Errorf("%+v: got %v, want %v", c.f, g, c.want)
		}
		for _, o := range got {
			if o.Capacity != 20 || o.Refill != 2 || !o.Until.Equal(until) || o.Note != o.Prefix+"/"+o.Key || o.UpdatedAt.IsZero() {
				t.Errorf("%+v", o)
			}
		}
	}
	for _, f := range []admin.OverrideFilter{{Limit: -1}, {Limit: admin.MaxOverrides + 1}, {AfterKey: "k"}} {
		if _, err := admin.Overrides(ctx, pool, f); !errors.Is(err, pgratelimit.ErrInvalidArgument) {
			t.Errorf("%+v: %v", f, err)
		}
	}
}

// Without migration 00010 the reads are ErrNotMigrated.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	pool := testdb.NewEmptySchema(t).Pool(t, 0)
	if _, err := admin.Policies(context.Background(), pool); !errors.Is(err, pgratelimit.ErrNotMigrated) {
		t.Errorf("Policies: %v", err)
	}
	if _, err := admin.Overrides(context.Background(), pool, admin.OverrideFilter{}); !errors.Is(err, pgratelimit.ErrNotMigrated) {
		t.Errorf("Overrides: %v", err)
	}
}

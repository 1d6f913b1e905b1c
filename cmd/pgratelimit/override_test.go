package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The CLI shows a key under the policy the application's limiters
// recorded when no policy flag is given, warns when the flags or two
// recorded policies disagree, and records none of its own.
func TestStoredPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	url, pool := s.URL(t), s.Pool(t, 0)
	app, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 20, Refill: 2, Interval: time.Minute})
	require.NoError(t, err)
	_, err = app.AllowN(ctx, "k", 15)
	require.NoError(t, err)

	code, out, stderr := pgrl(url, "peek", "--prefix", "api", "k")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"k" has 5 of 20 tokens`)
	require.Empty(t, stderr)

	code, out, stderr = pgrl(url, "peek", "--prefix", "api", "--capacity", "5", "k")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `of 5 tokens`)
	require.Contains(t, stderr, `warning: your flags say capacity 5, refill 1 every 1s, durable, but prefix "api"'s limiters run capacity 20, refill 2 every 1m0s, durable`)

	// The CLI's own checks record nothing.
	code, _, stderr = pgrl(url, "allow", "--prefix", "api", "--capacity", "7", "k")
	require.Equal(t, 0, code, stderr)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgratelimit_policies`).Scan(&n))
	require.Equal(t, 1, n)

	// A second instance with another policy: two recorded, the most
	// recently seen used.
	other, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 30, Refill: 3, Interval: time.Minute, Overrides: true})
	require.NoError(t, err)
	_, err = other.Peek(ctx, "k")
	require.NoError(t, err)
	code, out, stderr = pgrl(url, "peek", "--prefix", "api", "k")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `of 30 tokens`)
	require.Contains(t, stderr, `warning: prefix "api" has 2 recorded policies`)
	require.Contains(t, stderr, "using the most recently seen")
}

func TestOverrideCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	url, pool := s.URL(t), s.Pool(t, 0)
	app, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 20, Refill: 2, Interval: time.Hour, Overrides: true})
	require.NoError(t, err)
	_, err = app.AllowN(ctx, "k", 15)
	require.NoError(t, err)

	code, out, stderr := pgrl(url, "override", "set", "--prefix", "api", "k", "--capacity", "100", "--refill", "10", "--until", "48h", "--note", "vip")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `override set on "k" of prefix "api": capacity 100, refill 10, until `)
	require.Contains(t, out, "it has 85 of 100 tokens")
	r, err := app.AllowN(ctx, "k", 80) // the application's checks decide under it
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, int64(100), r.Limit)

	code, out, stderr = pgrl(url, "peek", "--prefix", "api", "k")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"k" has 5 of 100 tokens`)

	code, out, stderr = pgrl(url, "override", "list", "--prefix", "api", "--json")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, strings.Count(out, "\n"), out)
	require.Contains(t, out, `"prefix":"api","key":"k","capacity":100,"refill":10,"until":"`)
	require.Contains(t, out, `"note":"vip"`)
	code, out, _ = pgrl(url, "override", "list", "--prefix", "other")
	require.Equal(t, 0, code)
	require.Empty(t, out)

	code, out, stderr = pgrl(url, "override", "clear", "--prefix", "api", "k", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"cleared":true`)
	require.Contains(t, out, `"limit":20,"remaining":5`)
	r, err = app.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(20), r.Limit)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"override", "set", "k", "--capacity", "0", "--refill", "1"}, "Capacity 0 is below 1"},
		{[]string{"override", "set", "k", "--capacity", "5"}, "--capacity and --refill are the override's: give both"},
		{[]string{"override", "set", "k", "--capacity", "5", "--refill", "1", "--until", "yesterday"}, "--until must be"},
		{[]string{"override", "set", "--capacity", "5", "--refill", "1"}, "missing KEY"},
		{[]string{"override", "list", "--after", "k"}, "set Prefix"},
		{[]string{"override"}, "missing action: want set, list or clear"},
		{[]string{"override", "drop", "k"}, `unknown action "drop"`},
	} {
		code, _, stderr := pgrl(url, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, "%v", c.args)
	}
}

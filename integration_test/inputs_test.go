package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

var validConfig = pgratelimit.Config{Prefix: "in", Capacity: 10, Refill: 1, Interval: time.Second}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	for _, tc := range []struct {
		name  string
		edit  func(*pgratelimit.Config)
		field string
	}{
		{"empty prefix", func(c *pgratelimit.Config) { c.Prefix = "" }, "Prefix"},
		{"NUL prefix", func(c *pgratelimit.Config) { c.Prefix = "a\x00b" }, "Prefix"},
		{"bad UTF-8 prefix", func(c *pgratelimit.Config) { c.Prefix = "\xff" }, "Prefix"},
		{"long prefix", func(c *pgratelimit.Config) { c.Prefix = strings.Repeat("p", 257) }, "Prefix"},
		{"zero capacity", func(c *pgratelimit.Config) { c.Capacity = 0 }, "Capacity"},
		{"negative capacity", func(c *pgratelimit.Config) { c.Capacity = -1 }, "Capacity"},
		{"zero refill", func(c *pgratelimit.Config) { c.Refill = 0 }, "Refill"},
		{"negative refill", func(c *pgratelimit.Config) { c.Refill = -5 }, "Refill"},
		{"zero interval", func(c *pgratelimit.Config) { c.Interval = 0 }, "Interval"},
		{"negative interval", func(c *pgratelimit.Config) { c.Interval = -time.Second }, "Interval"},
		{"sub-microsecond interval", func(c *pgratelimit.Config) { c.Interval = time.Nanosecond }, "Interval"},
		{"unknown storage", func(c *pgratelimit.Config) { c.Storage = 7 }, "Storage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig
			tc.edit(&cfg)
			l, err := newLimiterOn(pool, cfg)
			require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
			require.ErrorContains(t, err, tc.field)
			require.Nil(t, l)
		})
	}
	_, err := newLimiterOn(nil, validConfig)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
}

// Every bad input gets its typed error before any database access.
func TestBadInputNeverReachesTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := newLimiterOn(unreachablePool(t), validConfig)
	require.NoError(t, err)

	badKeys := map[string]string{
		"empty":    "",
		"NUL":      "user\x00id",
		"UTF-8":    "\xc3\x28",
		"too long": strings.Repeat("k", 1024+1),
	}
	for name, key := range badKeys {
		t.Run("key "+name, func(t *testing.T) {
			_, err := l.Allow(ctx, key)
			require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
			_, err = l.In(pgratelimit.PgxTx(nil)).AllowN(ctx, key, 1)
			require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
			_, err = l.Peek(ctx, key)
			require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
			_, err = l.Refund(ctx, key, 1)
			require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
			require.ErrorIs(t, l.Reset(ctx, key), pgratelimit.ErrInvalidKey)
		})
	}
	for _, cost := range []int64{0, -1, -1 << 63} {
		_, err := l.AllowN(ctx, "k", cost)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidCost, "cost %d", cost)
		_, err = l.In(pgratelimit.PgxTx(nil)).AllowN(ctx, "k", cost)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidCost, "cost %d", cost)
		_, err = l.Refund(ctx, "k", cost)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidCost, "refund %d", cost)
	}
	for _, cost := range []int64{11, 1 << 62, 1<<63 - 1} {
		_, err := l.AllowN(ctx, "k", cost)
		require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity, "cost %d", cost)
		_, err = l.In(pgratelimit.PgxTx(nil)).AllowN(ctx, "k", cost)
		require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity, "cost %d", cost)
	}
	// And the same limiter does reach out for a valid input: proof the pool
	// above would have failed loudly.
	_, err = l.Allow(ctx, "k")
	require.Error(t, err)
	require.NotErrorIs(t, err, pgratelimit.ErrInvalidKey)
}

// Keys full of SQL and other metacharacters are just keys.
func TestHostileKeysAreJustKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "'; DROP TABLE x; --", Capacity: 2, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	keys := []string{
		"'; DROP TABLE pgratelimit_buckets; --",
		`" OR 1=1 --`,
		`$1 $$ \x00 %s %d`,
		"{\"json\": [1, 2]}",
		"line\r\nX-Injected: yes",
		"🔑 ключ 鍵",
		strings.Repeat("k", 1024),
	}
	for _, key := range keys {
		for i := range 3 {
			r, err := l.Allow(ctx, key)
			require.NoError(t, err)
			require.Equal(t, i < 2, r.Allowed, "key %q check %d", key, i)
		}
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgratelimit_buckets WHERE tokens = 0`).Scan(&rows))
	require.Equal(t, len(keys), rows)
	r, err := pool.Query(ctx, `SELECT key FROM pgratelimit_buckets ORDER BY key`)
	require.NoError(t, err)
	stored, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, keys, stored)
}

func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.NewEmptySchema(t).Pool(t, 0)
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		cfg := validConfig
		cfg.Storage = storage
		l, err := newLimiterOn(pool, cfg)
		require.NoError(t, err)
		_, err = l.Allow(ctx, "k")
		require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)
		require.ErrorContains(t, err, "migrate")
		_, err = l.Peek(ctx, "k")
		require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)
		require.ErrorIs(t, l.Reset(ctx, "k"), pgratelimit.ErrNotMigrated)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "k", 1)
		require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)
		require.NoError(t, tx.Rollback(ctx))
		if errors.Is(err, pgratelimit.ErrNotMigrated) {
			// The connection went back to the pool clean: the next check
			// on it fails the same way, not with "transaction aborted".
			_, err = l.Allow(ctx, "k")
			require.ErrorIs(t, err, pgratelimit.ErrNotMigrated)
		}
	}
}

// A nil transaction is ErrInvalidArgument in every form (In, Tx.AllowAll),
// pgx and database/sql alike, never a panic (issue #31).
func TestNilTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(t, pgratelimit.Config{Prefix: "niltx", Capacity: 10, Refill: 1, Interval: time.Second, Grants: true})
	for _, tx := range []pgratelimit.Tx{pgratelimit.PgxTx(nil), pgratelimit.SQLTx(nil), {}} {
		_, err := l.In(tx).AllowN(ctx, "k", 1)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
		_, err = tx.AllowAll(ctx, l.Charge("k", 1))
		require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
		_, err = l.In(tx).Grant(ctx, "k", 5, time.Time{})
		require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
		_, err = l.In(tx).Peek(ctx, "k")
		require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	}
}

package integration

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // the "postgres" database/sql driver
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// callerTx is a caller's transaction through one of the drivers: pgx, or
// database/sql with pgx's stdlib or lib/pq.
type callerTx struct {
	allowN   func(l *pgratelimit.Limiter, key string, cost int64) (pgratelimit.Result, error)
	allowAll func(charges ...pgratelimit.Charge) (pgratelimit.MultiResult, error)
	exec     func(sql string) error
	commit   func() error
	rollback func() error
}

type driver struct {
	name  string
	begin func(t *testing.T) callerTx
}

// drivers returns the three ways to begin a transaction on schema s.
func drivers(t *testing.T, s *testdb.Schema, pool *pgxpool.Pool) []driver {
	ctx := context.Background()
	sqlDriver := func(name string, db *sql.DB) driver {
		return driver{name, func(t *testing.T) callerTx {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return callerTx{
				allowN: func(l *pgratelimit.Limiter, key string, cost int64) (pgratelimit.Result, error) {
					return l.In(pgratelimit.SQLTx(tx)).AllowN(ctx, key, cost)
				},
				allowAll: func(cs ...pgratelimit.Charge) (pgratelimit.MultiResult, error) {
					return pgratelimit.SQLTx(tx).AllowAll(ctx, cs...)
				},
				exec:     func(q string) error { _, err := tx.ExecContext(ctx, q); return err },
				commit:   tx.Commit,
				rollback: tx.Rollback,
			}
		}}
	}
	std := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = std.Close() })
	pq, err := sql.Open("postgres", s.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = pq.Close() })
	return []driver{
		{"pgx", func(t *testing.T) callerTx {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			return callerTx{
				allowN: func(l *pgratelimit.Limiter, key string, cost int64) (pgratelimit.Result, error) {
					return l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, key, cost)
				},
				allowAll: func(cs ...pgratelimit.Charge) (pgratelimit.MultiResult, error) {
					return pgratelimit.PgxTx(tx).AllowAll(ctx, cs...)
				},
				exec:     func(q string) error { _, err := tx.Exec(ctx, q); return err },
				commit:   func() error { return tx.Commit(ctx) },
				rollback: func() error { return tx.Rollback(ctx) },
			}
		}},
		sqlDriver("database/sql+pgx", std),
		sqlDriver("database/sql+lib/pq", pq),
	}
}

// The caller's transaction, through every driver: spent only on commit,
// denied inside it without writing, and the row lock held until it ends.
func TestCallerTransactions(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE uploads (id bigserial PRIMARY KEY, owner text NOT NULL)`)
	require.NoError(t, err)
	for _, d := range drivers(t, s, pool) {
		t.Run(d.name, func(t *testing.T) {
			l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "credits-" + d.name, Capacity: 100, Refill: 1, Interval: time.Hour})
			require.NoError(t, err)
			spend := func(commit bool) pgratelimit.Result {
				tx := d.begin(t)
				r, err := tx.allowN(l, "acct-1", 30)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				require.NoError(t, tx.exec(`INSERT INTO uploads (owner) VALUES ('acct-1')`))
				if commit {
					require.NoError(t, tx.commit())
				} else {
					require.NoError(t, tx.rollback())
				}
				return r
			}
			require.Equal(t, int64(70), spend(false).Remaining, "inside the transaction the tokens are taken")
			p, err := l.Peek(ctx, "acct-1")
			require.NoError(t, err)
			require.Equal(t, int64(100), p.Remaining, "rollback gives them back")
			spend(true)
			p, err = l.Peek(ctx, "acct-1")
			require.NoError(t, err)
			require.Equal(t, int64(70), p.Remaining, "commit spends them")

			tx := d.begin(t)
			r, err := tx.allowN(l, "acct-1", 71)
			require.NoError(t, err)
			require.False(t, r.Allowed)
			require.Equal(t, int64(70), r.Remaining)

			// The row stays locked until the transaction ends.
			done := make(chan pgratelimit.Result)
			go func() {
				r, err := l.AllowN(ctx, "acct-1", 70)
				if err != nil {
					t.Errorf("concurrent check: %v", err)
				}
				done <- r
			}()
			select {
			case <-done:
				t.Fatal("a concurrent check did not wait for the transaction holding the row")
			case <-time.After(200 * time.Millisecond):
			}
			require.NoError(t, tx.commit())
			require.True(t, (<-done).Allowed)
		})
	}
}

// The user's and the organization's credits in the caller's transaction:
// commit spends both, rollback neither, and a denial by either spends
// nothing.
func TestAllowAllInCallerTransaction(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	ctx := context.Background()
	for _, d := range drivers(t, s, pool) {
		t.Run(d.name, func(t *testing.T) {
			user, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "user-" + d.name, Capacity: 50, Refill: 1, Interval: time.Hour})
			require.NoError(t, err)
			org, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "org-" + d.name, Capacity: 80, Refill: 1, Interval: time.Hour, Storage: pgratelimit.Ephemeral})
			require.NoError(t, err)
			charge := func(cost int64) []pgratelimit.Charge {
				return []pgratelimit.Charge{user.Charge("u1", cost), org.Charge("o1", cost)}
			}
			remaining := func() (int64, int64) {
				a, err := user.Peek(ctx, "u1")
				require.NoError(t, err)
				b, err := org.Peek(ctx, "o1")
				require.NoError(t, err)
				return a.Remaining, b.Remaining
			}

			tx := d.begin(t)
			m, err := tx.allowAll(charge(30)...)
			require.NoError(t, err)
			require.True(t, m.Allowed)
			require.NoError(t, tx.rollback())
			u, o := remaining()
			require.Equal(t, [2]int64{50, 80}, [2]int64{u, o}, "rollback spends neither")

			tx = d.begin(t)
			_, err = tx.allowAll(charge(30)...)
			require.NoError(t, err)
			require.NoError(t, tx.commit())
			u, o = remaining()
			require.Equal(t, [2]int64{20, 50}, [2]int64{u, o}, "commit spends both")

			tx = d.begin(t)
			m, err = tx.allowAll(charge(25)...)
			require.NoError(t, err)
			require.False(t, m.Allowed)
			require.False(t, m.Results[0].Allowed, "the user's credits said no")
			require.True(t, m.Results[1].Allowed, "the org's had enough")
			require.NoError(t, tx.commit())
			u, o = remaining()
			require.Equal(t, [2]int64{20, 50}, [2]int64{u, o}, "a denial spends nothing")
		})
	}
}

// Typed errors come out the same whatever the database/sql driver: lib/pq's
// errors are not pgx's *pgconn.PgError (regression: a missing table through
// lib/pq was its raw 42P01 error, not ErrNotMigrated).
func TestNotMigratedThroughEveryDriver(t *testing.T) {
	t.Parallel()
	s := testdb.NewEmptySchema(t)
	pool := s.Pool(t, 0)
	l, err := newLimiterOn(pool, validConfig)
	require.NoError(t, err)
	for _, d := range drivers(t, s, pool) {
		tx := d.begin(t)
		_, err := tx.allowN(l, "k", 1)
		require.ErrorIs(t, err, pgratelimit.ErrNotMigrated, d.name)
		require.ErrorContains(t, err, "migrate", d.name)
		require.NoError(t, tx.rollback(), d.name)
		tx = d.begin(t)
		_, err = tx.allowAll(l.Charge("k", 1))
		require.ErrorIs(t, err, pgratelimit.ErrNotMigrated, d.name+" AllowAll")
		require.NoError(t, tx.rollback(), d.name)
	}
}

// A caller's lock_timeout is ErrLockTimeout through every driver.
func TestLockTimeoutThroughEveryDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 0)
	l, err := newLimiterOn(pool, validConfig)
	require.NoError(t, err)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = l.In(pgratelimit.PgxTx(holder)).AllowN(ctx, "held", 1)
	require.NoError(t, err)
	for _, d := range drivers(t, s, pool) {
		tx := d.begin(t)
		if os.Getenv(testdb.DistributeEnvVar) != "" {
			// Citus runs the statements on a worker, which gets the
			// caller's SET LOCAL only when told to pass it on.
			require.NoError(t, tx.exec("SET LOCAL citus.propagate_set_commands = 'local'"), d.name)
		}
		require.NoError(t, tx.exec("SET LOCAL lock_timeout = '50ms'"), d.name)
		_, err := tx.allowN(l, "held", 1)
		require.ErrorIs(t, err, pgratelimit.ErrLockTimeout, d.name)
		require.NoError(t, tx.rollback(), d.name)
	}
}

// Every form of the caller's transaction (In, Tx.AllowAll) charges on
// commit and nothing on rollback, with either driver.
func TestTxForms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	l, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "txforms", Capacity: 100, Refill: 1, Interval: time.Hour, Grants: true})
	require.NoError(t, err)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	calls := map[string]func(pgx.Tx, *sql.Tx) error{
		"In(PgxTx).AllowN": func(tx pgx.Tx, _ *sql.Tx) error {
			_, err := l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, "k", 1)
			return err
		},
		"In(SQLTx).AllowN": func(_ pgx.Tx, tx *sql.Tx) error {
			_, err := l.In(pgratelimit.SQLTx(tx)).AllowN(ctx, "k", 1)
			return err
		},
		"PgxTx.AllowAll": func(tx pgx.Tx, _ *sql.Tx) error {
			_, err := pgratelimit.PgxTx(tx).AllowAll(ctx, l.Charge("k", 1))
			return err
		},
		"SQLTx.AllowAll": func(_ pgx.Tx, tx *sql.Tx) error {
			_, err := pgratelimit.SQLTx(tx).AllowAll(ctx, l.Charge("k", 1))
			return err
		},
		"In(PgxTx).Grant": func(tx pgx.Tx, _ *sql.Tx) error {
			_, err := l.In(pgratelimit.PgxTx(tx)).Grant(ctx, "k", 1, time.Time{})
			return err
		},
		"In(SQLTx).Grant": func(_ pgx.Tx, tx *sql.Tx) error {
			_, err := l.In(pgratelimit.SQLTx(tx)).Grant(ctx, "k", 1, time.Time{})
			return err
		},
	}
	balance := func() int64 {
		r, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		return r.Remaining + r.Granted
	}
	for name, call := range calls {
		for _, commit := range []bool{false, true} {
			before := balance()
			ptx, err := pool.Begin(ctx)
			require.NoError(t, err)
			stx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, call(ptx, stx), name)
			if commit {
				require.NoError(t, ptx.Commit(ctx))
				require.NoError(t, stx.Commit())
				require.NotEqual(t, before, balance(), "%s committed: the balance changed", name)
			} else {
				require.NoError(t, ptx.Rollback(ctx))
				require.NoError(t, stx.Rollback())
				require.Equal(t, before, balance(), "%s rolled back: nothing changed", name)
			}
		}
	}
}

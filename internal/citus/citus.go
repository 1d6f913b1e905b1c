// Package citus is what pgratelimit does differently on a Citus cluster
// whose tables are distributed by key (migrations.Distribute): the
// coordinator's dialect (every statement on one row, so that it routes to
// one shard), the shard map and Citus's hash of keys, the router that sends
// a check to the node holding its shards and runs it there on the shards'
// own tables, the guard that keeps those shards in place while it runs, and
// where cleanup deletes each shard's rows. It knows nothing of coalescing:
// the client gives each node's checks to a coalescer of its own.
package citus

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Coordinator is the dialect of a Citus cluster with distributed bucket
// tables, through the coordinator (checks routed to the nodes speak the
// routed dialect, see Router): every statement must route to one shard, so
// it filters on one row's full primary key with scalar parameters.
type Coordinator struct{}

// Name is "citus".
func (Coordinator) Name() string { return "citus" }

// Shape is always one row per statement, in Citus's fast path.
func (Coordinator) Shape(int, bool) engine.Shape { return coordinatorRow{} }

// Set is SET LOCAL commands, which Citus passes on to the workers (where
// the row locks are) when told to; set_config is not propagated.
func (Coordinator) Set(pairs []string) []engine.Stmt {
	stmts := []engine.Stmt{{SQL: "SET LOCAL citus.propagate_set_commands = 'local'"}}
	for i := 0; i < len(pairs); i += 2 {
		stmts = append(stmts, engine.Stmt{SQL: "SET LOCAL " + pairs[i] + " = '" + pairs[i+1] + "'"}) // our own names and values
	}
	return stmts
}

// OneRowBatches: a transaction over several shards would need two-phase
// commit.
func (Coordinator) OneRowBatches() bool { return true }

// coordinatorRow is OneRow in statements that Citus's fast path plans for
// one shard, from a plan kept per connection: the lock is a plain SELECT of
// the bucket table, and the database's clock is read by a statement of its
// own after the locks (Citus plans every execution of a statement with a
// volatile function afresh).
type coordinatorRow struct{ engine.OneRow }

// Lock locks each row, then reads its grants when a spends them, for the
// rows it holds, and its override when a reads overrides (a statement of
// its own after the lock, so read with a snapshot taken after the lock; a
// row a skipped defers its requests, whatever was read of its override).
func (coordinatorRow) Lock(s engine.Storage, rows []engine.Row, a *engine.Attempt) []engine.Stmt {
	ts := a.Table(&s.Statements().Citus)
	sql := ts.Lock
	if a.Mode() != engine.WaitLocks {
		sql = ts.LockSkip
	}
	scan := a.ScanRows(s, false, false)
	var stmts []engine.Stmt
	for _, r := range rows {
		stmts = append(stmts, engine.Stmt{SQL: sql, Args: []any{r.Prefix, r.Key, a.ClockParam()}, Scan: scan})
		stmts = append(stmts, grantsOf(s, r, a)...)
		stmts = append(stmts, a.OverrideRead(r)...)
	}
	return stmts
}

// Relock upserts and locks each row, then reads the clock again: these
// rows were locked after it was read.
func (c coordinatorRow) Relock(s engine.Storage, rows []engine.Row, a *engine.Attempt) []engine.Stmt {
	scan := a.ScanRows(s, false, false)
	var stmts []engine.Stmt
	for _, r := range rows {
		stmts = append(stmts, engine.Stmt{SQL: a.Table(&s.Statements().Citus).Relock, Args: []any{r.Prefix, r.Key, a.Interval(r), a.ClockParam()}, Scan: scan})
		stmts = append(stmts, grantsOf(s, r, a)...)
		stmts = append(stmts, a.OverrideRead(r)...)
	}
	return append(stmts, c.Clock(a)...)
}

// Clock reads the database's clock after the locks, unless the limiter
// has a clock of its own.
func (coordinatorRow) Clock(a *engine.Attempt) []engine.Stmt {
	if a.ClockParam() != nil {
		return nil
	}
	return []engine.Stmt{a.ReadClock()}
}

// grantsOf reads r's grants, locked, if a spends grants of s: skipping
// locked ones when a skips locked rows (only a transaction that holds r's
// bucket locks its grants, and then r's bucket is not a's).
func grantsOf(s engine.Storage, r engine.Row, a *engine.Attempt) []engine.Stmt {
	if !a.WithGrants(s) {
		return nil
	}
	sql := sqlgen.Grants.LockOne
	if a.Mode() != engine.WaitLocks {
		sql = sqlgen.Grants.LockOneSkip
	}
	return []engine.Stmt{{SQL: sql, Args: []any{r.Prefix, r.Key}, Scan: func(rs engine.RowScanner) error {
		var g account.Grant
		var exp *time.Time
		row := engine.Row{Storage: s}
		for rs.Next() {
			if err := rs.Scan(&row.Prefix, &row.Key, &g.ID, &g.Amount, &exp, &g.Ledger); err != nil {
				return err
			}
			g.ExpiresAt = time.Time{}
			if exp != nil {
				g.ExpiresAt = *exp
			}
			a.AddGrant(row, g)
		}
		return rs.Err()
	}}}
}

// querier is what detection needs of a pool, a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Detect asks the database whether the bucket tables are distributed tables
// of Citus: Coordinator if so, else engine.Postgres (tables that do not exist
// yet count as plain).
func Detect(ctx context.Context, q querier) (engine.Dialect, error) {
	const why = "detect the database's dialect (plain PostgreSQL or Citus)"
	var citusHere, dist bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citusHere); err != nil {
		return nil, engine.DBError(why, err)
	}
	if citusHere {
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN (to_regclass($1), to_regclass($2)))`, sqlgen.DurableTable, sqlgen.EphemeralTable).Scan(&dist)
		if err != nil {
			return nil, engine.DBError(why, err)
		}
	}
	if dist {
		return Coordinator{}, nil
	}
	return engine.Postgres{}, nil
}

package engine

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// The statement shapes of a Citus cluster whose bucket tables are
// distributed by key (migrations.Distribute): Citus through its
// coordinator, and OnShards on the node a check was routed to. Which node
// holds which shard, and when a check may be routed, is internal/citus's
// (its Router and shard map); what a transaction sends is the engine's.

// Citus is the dialect of a Citus cluster with distributed bucket tables,
// through the coordinator (checks routed to the nodes speak OnShards):
// every statement must route to one shard, so it filters on one row's full
// primary key with scalar parameters.
type Citus struct{}

// Name is "citus".
func (Citus) Name() string { return "citus" }

// Shape is always one row per statement, in Citus's fast path.
func (Citus) Shape(int, bool) Shape { return coordinatorRow{} }

// Set is SET LOCAL commands, which Citus passes on to the workers (where
// the row locks are) when told to; set_config is not propagated.
func (Citus) Set(pairs []string) []Stmt {
	stmts := []Stmt{{SQL: "SET LOCAL citus.propagate_set_commands = 'local'"}}
	for i := 0; i < len(pairs); i += 2 {
		stmts = append(stmts, Stmt{SQL: "SET LOCAL " + pairs[i] + " = '" + pairs[i+1] + "'"}) // our own names and values
	}
	return stmts
}

// OneRowBatches: a transaction over several shards would need two-phase
// commit.
func (Citus) OneRowBatches() bool { return true }

// coordinatorRow is OneRow in statements that Citus's fast path plans for
// one shard, from a plan kept per connection: the lock is a plain SELECT of
// the bucket table, and the database's clock is read by a statement of its
// own after the locks (Citus plans every execution of a statement with a
// volatile function afresh).
type coordinatorRow struct{ OneRow }

// Lock locks each row, then reads its grants when a spends them, for the
// rows it holds, and its override when a reads overrides (a statement of
// its own after the lock, so read with a snapshot taken after the lock; a
// row a skipped defers its requests, whatever was read of its override).
func (coordinatorRow) Lock(s Storage, rows []Row, a *Attempt) []Stmt {
	ts := a.tableFor(&s.Statements().Citus)
	sql := ts.Lock
	if a.mode != WaitLocks {
		sql = ts.LockSkip
	}
	scan := a.scanRows(s, lockCols{})
	var stmts []Stmt
	for _, r := range rows {
		stmts = append(stmts, Stmt{SQL: sql, Args: []any{r.Prefix, r.Key, a.clock}, Scan: scan})
		stmts = append(stmts, grantsOf(s, r, a)...)
		stmts = append(stmts, a.overrideRead(r)...)
	}
	return stmts
}

// Relock upserts and locks each row, then reads the clock again: these
// rows were locked after it was read.
func (c coordinatorRow) Relock(s Storage, rows []Row, a *Attempt) []Stmt {
	scan := a.scanRows(s, lockCols{})
	var stmts []Stmt
	for _, r := range rows {
		stmts = append(stmts, Stmt{SQL: a.tableFor(&s.Statements().Citus).Relock, Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock}, Scan: scan})
		stmts = append(stmts, grantsOf(s, r, a)...)
		stmts = append(stmts, a.overrideRead(r)...)
	}
	return append(stmts, c.Clock(a)...)
}

// Clock reads the database's clock after the locks, unless the limiter
// has a clock of its own.
func (coordinatorRow) Clock(a *Attempt) []Stmt {
	if a.clock != nil {
		return nil
	}
	return []Stmt{a.clockStmt()}
}

// grantsOf reads r's grants, locked, if a spends grants of s: skipping
// locked ones when a skips locked rows (only a transaction that holds r's
// bucket locks its grants, and then r's bucket is not a's).
func grantsOf(s Storage, r Row, a *Attempt) []Stmt {
	if !a.readsGrants(s) {
		return nil
	}
	sql := sqlgen.Grants.LockOne
	if a.mode != WaitLocks {
		sql = sqlgen.Grants.LockOneSkip
	}
	return []Stmt{{SQL: sql, Args: []any{r.Prefix, r.Key}, Scan: func(rs RowScanner) error {
		var g account.Grant
		var exp *time.Time
		row := Row{Storage: s}
		for rs.Next() {
			if err := rs.Scan(&row.Prefix, &row.Key, &g.ID, &g.Amount, &exp, &g.Ledger); err != nil {
				return err
			}
			g.ExpiresAt = time.Time{}
			if exp != nil {
				g.ExpiresAt = *exp
			}
			a.addGrant(row, g)
		}
		return rs.Err()
	}}}
}

// ShardMap is where the rows of a transaction routed to a Citus node are:
// internal/citus's reading of the shard map.
type ShardMap interface {
	// Table returns the statements of the shard table that holds r (of
	// storage s).
	Table(s Storage, r Row) *sqlgen.Table
	// Shards returns the IDs of the shards that hold rows, distinct and
	// sorted, as an array parameter (sqlgen.Int64Array).
	Shards(rows []Row) string
}

// OnShards is the dialect of a transaction routed to a Citus node: plain
// PostgreSQL's, on the tables of the shards that hold its rows, after the
// guard that keeps those shards on the node. Comparable when Map is (a
// pointer): the batches of one reading of the map share it.
type OnShards struct{ Map ShardMap }

// Name is "citus".
func (OnShards) Name() string { return "citus" }

// Shape is one row per statement, on each row's shard table.
func (d OnShards) Shape(int, bool) Shape { return shardRows(d) }

// Set is plain PostgreSQL's.
func (OnShards) Set(pairs []string) []Stmt { return Postgres{}.Set(pairs) }

// OneRowBatches: a batch holds any rows of the node's shards.
func (OnShards) OneRowBatches() bool { return false }

// shardRows is OneRow on each row's shard table, after the guard.
type shardRows OnShards

// Insert: the attempt's first row's insert, the first statement to touch a
// shard, takes the guard's locks first (see Guard).
func (d shardRows) Insert(s Storage, rows []Row, a *Attempt) []Stmt {
	return perRow(rows, func(r Row) Stmt {
		ts := d.Map.Table(s, r)
		if r == a.Rows()[0] {
			return Stmt{SQL: ts.GuardedInsert, Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock, d.Map.Shards(a.Rows())}}
		}
		return Stmt{SQL: ts.Insert, Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock}}
	})
}

// Lock locks each row on its shard, and reads whether the node still holds
// the shard.
func (d shardRows) Lock(s Storage, rows []Row, a *Attempt) []Stmt {
	scan := a.scanRows(s, lockCols{placed: true})
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: a.lockSQL(d.Map.Table(s, r), s), Args: []any{r.Prefix, r.Key, a.clock}, Scan: scan}
	})
}

// Relock upserts and locks each row a cleanup deleted, on its shard.
func (d shardRows) Relock(s Storage, rows []Row, a *Attempt) []Stmt {
	scan := a.scanRows(s, lockCols{placed: true})
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: a.relockSQL(d.Map.Table(s, r), s), Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock}, Scan: scan}
	})
}

// Update writes each row on its shard.
func (d shardRows) Update(s Storage, rows []Row, a *Attempt) []Stmt {
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: d.Map.Table(s, r).Update, Args: a.updateArgs(r)}
	})
}

// UpdateData is OneRow's (routed transactions write buckets only).
func (shardRows) UpdateData(s Storage, rows []Row, a *Attempt) []Stmt {
	return OneRow{}.UpdateData(s, rows, a)
}

// Values is OneRow's (routed transactions write buckets only).
func (shardRows) Values(sql sqlgen.Rows, rows [][]any, scan func(RowScanner) error) []Stmt {
	return OneRow{}.Values(sql, rows, scan)
}

// Settings: none.
func (shardRows) Settings() []string { return nil }

// Clock: the locks read it.
func (shardRows) Clock(*Attempt) []Stmt { return nil }

// Guard takes the shards' metadata locks (ShareLock, 5: what Citus's
// executor takes before it writes to a shard, and a shard move waits for):
// in the first insert (Insert), or, in an attempt that inserts nothing, in
// a statement of its own. Whether this node still holds each shard is read
// after it, with each row (the lock and relock statements' last column,
// see Attempt.scanRows): a row of a shard that moved fails the transaction
// before anything is decided.
func (d shardRows) Guard(a *Attempt) []Stmt {
	if a.mode != SkipLockedNoInsert {
		return nil
	}
	return []Stmt{{SQL: sqlgen.LockShards, Args: []any{d.Map.Shards(a.Rows())}}}
}

package pgratelimit

import (
	"fmt"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// shape builds a transaction's statements over the rows of one table (sorted,
// distinct): the INSERT of missing rows, the locking SELECT (per the
// attempt's lock mode), the upsert that locks rows a cleanup deleted in
// between, and the UPDATE of the rows that changed. A plan's shape is chosen
// once (newPlan): one row per statement in the caller's transaction and
// where the dialect says so, arrays otherwise.
type shape interface {
	insert(s Storage, rows []row, a *attempt) []stmt
	lock(s Storage, rows []row, a *attempt) []stmt
	relock(s Storage, rows []row, a *attempt) []stmt
	update(s Storage, rows []row, a *attempt) []stmt
	// values runs sql over rows of values (string, int64 and time.Time
	// columns), reading what it returns with scan (nil: nothing).
	values(sql sqlgen.Rows, rows [][]any, scan func(rowScanner) error) []stmt
	// settings are the setting pairs the shape's statements need in an own
	// transaction.
	settings() []string
	// clock reads the database's clock after the locks, if the locking
	// statements do not.
	clock(a *attempt) []stmt
	// guard is what an own transaction runs before its first row: on a
	// Citus node, the locks that keep its shards there (shardRows).
	guard(a *attempt) []stmt
}

// oneRow sends a statement per row with scalar parameters: cheaper than
// arrays for a few rows, the shape for a caller's transaction (nothing is
// planned under the caller's settings), and the only one a distributed
// table (Citus) routes to one shard.
type oneRow struct{}

func (oneRow) insert(s Storage, rows []row, a *attempt) []stmt {
	return perRow(rows, func(r row) stmt {
		return stmt{sql: s.statements().One.Insert, args: []any{r.prefix, r.key, a.interval(r), a.clock}}
	})
}

func (oneRow) lock(s Storage, rows []row, a *attempt) []stmt {
	sql, scan := a.lockSQL(&s.statements().One, s), a.scanInto(s)
	return perRow(rows, func(r row) stmt {
		return stmt{sql: sql, args: []any{r.prefix, r.key, a.clock}, scan: scan}
	})
}

func (oneRow) relock(s Storage, rows []row, a *attempt) []stmt {
	sql, scan := a.relockSQL(&s.statements().One, s), a.scanInto(s)
	return perRow(rows, func(r row) stmt {
		return stmt{sql: sql, args: []any{r.prefix, r.key, a.interval(r), a.clock}, scan: scan}
	})
}

func (oneRow) update(s Storage, rows []row, a *attempt) []stmt {
	return perRow(rows, func(r row) stmt {
		return stmt{sql: s.statements().One.Update, args: a.updateArgs(r)}
	})
}

// updateArgs are the parameters of the one-row UPDATE of r's bucket as
// decided.
func (a *attempt) updateArgs(r row) []any {
	b := a.state[r].Bucket
	return []any{r.prefix, r.key, b.Tokens, b.RefilledAt, b.ExpiresAt, b.Capacity}
}

func (oneRow) values(sql sqlgen.Rows, rows [][]any, scan func(rowScanner) error) []stmt {
	stmts := make([]stmt, len(rows))
	for i, r := range rows {
		args := make([]any, len(r))
		for j, v := range r {
			if t, ok := v.(time.Time); ok {
				v = t.UTC().Format(time.RFC3339Nano) // cast from text in SQL, as arrays are
			}
			args[j] = v
		}
		stmts[i] = stmt{sql: sql.One, args: args, scan: scan}
	}
	return stmts
}

func (oneRow) settings() []string { return nil }

func (oneRow) clock(*attempt) []stmt { return nil }
func (oneRow) guard(*attempt) []stmt { return nil }

func perRow(rows []row, f func(r row) stmt) []stmt {
	stmts := make([]stmt, len(rows))
	for i, r := range rows {
		stmts[i] = f(r)
	}
	return stmts
}

// arrays sends one statement over all of a table's rows, its columns as
// array parameters: a batch of any size costs the same few statements.
type arrays struct{}

func (arrays) insert(s Storage, rows []row, a *attempt) []stmt {
	return []stmt{{sql: s.statements().Many.Insert, args: []any{prefixArray(rows), keyArray(rows), horizonArray(rows, a), a.clock}}}
}

func (arrays) lock(s Storage, rows []row, a *attempt) []stmt {
	return []stmt{{sql: a.lockSQL(&s.statements().Many, s), args: []any{prefixArray(rows), keyArray(rows), a.clock}, scan: a.scanInto(s)}}
}

func (arrays) relock(s Storage, rows []row, a *attempt) []stmt {
	return []stmt{{sql: a.relockSQL(&s.statements().Many, s), args: []any{prefixArray(rows), keyArray(rows), horizonArray(rows, a), a.clock}, scan: a.scanInto(s)}}
}

func (arrays) update(s Storage, rows []row, a *attempt) []stmt {
	return []stmt{{sql: s.statements().Many.Update, args: []any{
		prefixArray(rows), keyArray(rows),
		sqlgen.Int64Array(len(rows), func(i int) int64 { return a.state[rows[i]].Bucket.Tokens }),
		sqlgen.TimeArray(len(rows), func(i int) time.Time { return a.state[rows[i]].Bucket.RefilledAt }),
		sqlgen.TimeArray(len(rows), func(i int) time.Time { return a.state[rows[i]].Bucket.ExpiresAt }),
		sqlgen.Int64Array(len(rows), func(i int) int64 { return a.state[rows[i]].Bucket.Capacity }),
	}}}
}

func (arrays) values(sql sqlgen.Rows, rows [][]any, scan func(rowScanner) error) []stmt {
	args := make([]any, len(rows[0]))
	for j := range args {
		switch rows[0][j].(type) {
		case string:
			args[j] = sqlgen.TextArray(len(rows), func(i int) string { return rows[i][j].(string) })
		case int64:
			args[j] = sqlgen.Int64Array(len(rows), func(i int) int64 { return rows[i][j].(int64) })
		case time.Time:
			args[j] = sqlgen.TimeArray(len(rows), func(i int) time.Time { return rows[i][j].(time.Time) })
		default:
			panic(fmt.Sprintf("pgratelimit: no array of %T", rows[0][j])) // a bug of ours, not an input
		}
	}
	return []stmt{{sql: sql.Many, args: args, scan: scan}}
}

// settings plan the array statements once per connection (a generic plan),
// and only as nested loops over the arrays with an index lookup per row: the
// plan that fits a batch whatever the table's size or statistics were when
// it was made (an empty table's would scan it whole). Planning each batch
// instead cost a third of the server's time per check.
func (arrays) settings() []string {
	return []string{"plan_cache_mode", "force_generic_plan",
		"enable_seqscan", "off", "enable_hashjoin", "off", "enable_mergejoin", "off"}
}

func (arrays) clock(*attempt) []stmt { return nil }
func (arrays) guard(*attempt) []stmt { return nil }

// lockSQL is the locking statement of ts for a's lock mode, reading grants
// when a does for rows of s.
func (a *attempt) lockSQL(ts *sqlgen.Table, s Storage) string {
	switch skip := a.mode != waitLocks; {
	case a.withGrants(s) && skip:
		return ts.LockSkipGrants
	case a.withGrants(s):
		return ts.LockGrants
	case skip:
		return ts.LockSkip
	}
	return ts.Lock
}

// relockSQL is the relock statement of ts, reading grants when a does for
// rows of s.
func (a *attempt) relockSQL(ts *sqlgen.Table, s Storage) string {
	if a.withGrants(s) {
		return ts.RelockGrants
	}
	return ts.Relock
}

// byStorage yields the parts of sorted rows that share a table, in order.
func byStorage(rows []row) func(yield func(Storage, []row) bool) {
	return func(yield func(Storage, []row) bool) {
		for len(rows) > 0 {
			n := 1
			for n < len(rows) && rows[n].storage == rows[0].storage {
				n++
			}
			if !yield(rows[0].storage, rows[:n]) {
				return
			}
			rows = rows[n:]
		}
	}
}

func prefixArray(rows []row) string {
	return sqlgen.TextArray(len(rows), func(i int) string { return rows[i].prefix })
}

func keyArray(rows []row) string {
	return sqlgen.TextArray(len(rows), func(i int) string { return rows[i].key })
}

func horizonArray(rows []row, a *attempt) string {
	return sqlgen.TextArray(len(rows), func(i int) string { return a.interval(rows[i]) })
}

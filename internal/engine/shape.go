package engine

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Shape builds a transaction's statements over the rows of one table
// (sorted, distinct): the INSERT of missing rows, the locking SELECT (per
// the attempt's lock mode), the upsert that locks rows a cleanup deleted in
// between, and the UPDATE of the rows that changed. A plan's shape is chosen
// once (NewPlan): one row per statement in the caller's transaction and
// where the dialect says so, arrays otherwise.
type Shape interface {
	Insert(s Storage, rows []Row, a *Attempt) []Stmt
	Lock(s Storage, rows []Row, a *Attempt) []Stmt
	Relock(s Storage, rows []Row, a *Attempt) []Stmt
	Update(s Storage, rows []Row, a *Attempt) []Stmt
	// UpdateData writes the leases columns that a's parts set
	// (Attempt.SetData).
	UpdateData(s Storage, rows []Row, a *Attempt) []Stmt
	// Values runs sql over rows of values (string, int64 and time.Time
	// columns), reading what it returns with scan (nil: nothing).
	Values(sql sqlgen.Rows, rows [][]any, scan func(RowScanner) error) []Stmt
	// Settings are the setting pairs the shape's statements need in an own
	// transaction.
	Settings() []string
	// Clock reads the database's clock after the locks, if the locking
	// statements do not.
	Clock(a *Attempt) []Stmt
	// Guard is what an own transaction runs before its first row: on a
	// Citus node, the locks that keep its shards there (shardRows).
	Guard(a *Attempt) []Stmt
}

// OneRow sends a statement per row with scalar parameters: cheaper than
// arrays for a few rows, the shape for a caller's transaction (nothing is
// planned under the caller's Settings), and the only one a distributed
// table (Citus) routes to one shard.
type OneRow struct{}

// Insert inserts the missing rows as placeholders, one statement each.
func (OneRow) Insert(s Storage, rows []Row, a *Attempt) []Stmt {
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: a.tableFor(&s.Statements().One).Insert, Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock}}
	})
}

// Lock locks each row, with its grants when a reads them.
func (OneRow) Lock(s Storage, rows []Row, a *Attempt) []Stmt {
	sql, scan := a.lockSQL(&s.Statements().One, s), a.scanInto(s)
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: sql, Args: []any{r.Prefix, r.Key, a.clock}, Scan: scan}
	})
}

// Relock upserts and locks each row a cleanup deleted meanwhile.
func (OneRow) Relock(s Storage, rows []Row, a *Attempt) []Stmt {
	sql, scan := a.relockSQL(&s.Statements().One, s), a.scanInto(s)
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: sql, Args: []any{r.Prefix, r.Key, a.Interval(r), a.clock}, Scan: scan}
	})
}

// Update writes each row as decided.
func (OneRow) Update(s Storage, rows []Row, a *Attempt) []Stmt {
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: a.tableFor(&s.Statements().One).Update, Args: a.updateArgs(r)}
	})
}

// UpdateData writes each row's leases column as set.
func (OneRow) UpdateData(s Storage, rows []Row, a *Attempt) []Stmt {
	sql := a.tableFor(&s.Statements().One).UpdateData
	return perRow(rows, func(r Row) Stmt {
		return Stmt{SQL: sql, Args: []any{r.Prefix, r.Key, a.data[r], a.keep[r]}}
	})
}

// updateArgs are the parameters of the one-row UPDATE of r's bucket as
// decided.
func (a *Attempt) updateArgs(r Row) []any {
	b := a.state[r].Bucket
	return []any{r.Prefix, r.Key, b.Tokens, b.RefilledAt, b.ExpiresAt, b.Capacity}
}

// Values sends sql once per row of values, times as text.
func (OneRow) Values(sql sqlgen.Rows, rows [][]any, scan func(RowScanner) error) []Stmt {
	stmts := make([]Stmt, len(rows))
	for i, r := range rows {
		args := make([]any, len(r))
		for j, v := range r {
			if t, ok := v.(time.Time); ok {
				v = t.UTC().Format(time.RFC3339Nano) // cast from text in SQL, as arrays are
			}
			args[j] = v
		}
		stmts[i] = Stmt{SQL: sql.One, Args: args, Scan: scan}
	}
	return stmts
}

// Settings: none.
func (OneRow) Settings() []string { return nil }

// Clock: the locks read it.
func (OneRow) Clock(*Attempt) []Stmt { return nil }

// Guard: none.
func (OneRow) Guard(*Attempt) []Stmt { return nil }

func perRow(rows []Row, f func(r Row) Stmt) []Stmt {
	stmts := make([]Stmt, len(rows))
	for i, r := range rows {
		stmts[i] = f(r)
	}
	return stmts
}

// arrays sends one statement over all of a table's rows, its columns as
// array parameters: a batch of any size costs the same few statements.
type arrays struct{}

func (arrays) Insert(s Storage, rows []Row, a *Attempt) []Stmt {
	return []Stmt{{SQL: a.tableFor(&s.Statements().Many).Insert, Args: []any{prefixArray(rows), keyArray(rows), horizonArray(rows, a), a.clock}}}
}

// Lock reads each row by its position in rows; Lock and Relock read each
// row's ctid too, for Update.
func (arrays) Lock(s Storage, rows []Row, a *Attempt) []Stmt {
	return []Stmt{{SQL: a.lockSQL(&s.Statements().Many, s), Args: []any{prefixArray(rows), keyArray(rows), a.clock},
		Scan: a.scanRows(s, lockCols{at: rows, grants: a.readsGrants(s), tid: true})}}
}

func (arrays) Relock(s Storage, rows []Row, a *Attempt) []Stmt {
	return []Stmt{{SQL: a.relockSQL(&s.Statements().Many, s), Args: []any{prefixArray(rows), keyArray(rows), horizonArray(rows, a), a.clock},
		Scan: a.scanRows(s, lockCols{grants: a.readsGrants(s), tid: true})}}
}

// Update finds the rows by their ctids as the locks read them, and fails
// the transaction unless it changes each one (see sqlgen.Table.Update).
func (arrays) Update(s Storage, rows []Row, a *Attempt) []Stmt {
	bs := column(rows, func(r Row) *account.Bucket { return &a.state[r].Bucket })
	args := []any{
		tids(column(rows, func(r Row) pgtype.TID { return a.tids[r] })),
		int64s(column(bs, func(b *account.Bucket) int64 { return b.Tokens })),
		times(column(bs, func(b *account.Bucket) time.Time { return b.RefilledAt })),
		times(column(bs, func(b *account.Bucket) time.Time { return b.ExpiresAt })),
		int64s(column(bs, func(b *account.Bucket) int64 { return b.Capacity })),
	}
	return []Stmt{{SQL: a.tableFor(&s.Statements().Many).Update, Args: args, Changes: int64(len(rows))}}
}

// UpdateData finds the rows by their ctids, as Update does.
func (arrays) UpdateData(s Storage, rows []Row, a *Attempt) []Stmt {
	args := []any{
		tids(column(rows, func(r Row) pgtype.TID { return a.tids[r] })),
		texts(column(rows, func(r Row) string { return a.data[r] })),
		times(column(rows, func(r Row) time.Time { return a.keep[r] })),
	}
	return []Stmt{{SQL: a.tableFor(&s.Statements().Many).UpdateData, Args: args, Changes: int64(len(rows))}}
}

func (arrays) Values(sql sqlgen.Rows, rows [][]any, scan func(RowScanner) error) []Stmt {
	args := make([]any, len(rows[0]))
	for j := range args {
		switch rows[0][j].(type) {
		case string:
			args[j] = texts(column(rows, func(r []any) string { return r[j].(string) }))
		case int64:
			args[j] = int64s(column(rows, func(r []any) int64 { return r[j].(int64) }))
		case time.Time:
			args[j] = times(column(rows, func(r []any) time.Time { return r[j].(time.Time) }))
		default:
			panic(fmt.Sprintf("pgratelimit: no array of %T", rows[0][j])) // a bug of ours, not an input
		}
	}
	return []Stmt{{SQL: sql.Many, Args: args, Scan: scan}}
}

// settings plan the array statements once per connection (a generic plan),
// and only as nested loops over the arrays with an index lookup per row: the
// plan that fits a batch whatever the table's size or statistics were when
// it was made (an empty table's would scan it whole). Planning each batch
// instead cost a third of the server's time per check.
func (arrays) Settings() []string {
	return []string{"plan_cache_mode", "force_generic_plan",
		"enable_seqscan", "off", "enable_hashjoin", "off", "enable_mergejoin", "off"}
}

func (arrays) Clock(*Attempt) []Stmt { return nil }
func (arrays) Guard(*Attempt) []Stmt { return nil }

// tableFor is ts, or ts.Data when a's locks read the rows' leases column (a
// charge is a Part's), or their Overrides when they read the rows'
// overrides (and its inserts fill new rows' overrides).
func (a *Attempt) tableFor(ts *sqlgen.Table) *sqlgen.Table {
	if a.readsData {
		ts = ts.Data
	}
	if a.inlineOverrides() && ts.Overrides != nil {
		ts = ts.Overrides
	}
	return ts
}

// lockSQL is the locking statement of ts for a's lock mode, reading grants
// when a does for rows of s (and the leases column, see tableFor).
func (a *Attempt) lockSQL(ts *sqlgen.Table, s Storage) string {
	ts = a.tableFor(ts)
	switch skip := a.mode != WaitLocks; {
	case a.readsGrants(s) && skip:
		return ts.LockSkipGrants
	case a.readsGrants(s):
		return ts.LockGrants
	case skip:
		return ts.LockSkip
	}
	return ts.Lock
}

// relockSQL is the relock statement of ts, reading grants when a does for
// rows of s.
func (a *Attempt) relockSQL(ts *sqlgen.Table, s Storage) string {
	ts = a.tableFor(ts)
	if a.readsGrants(s) {
		return ts.RelockGrants
	}
	return ts.Relock
}

// byStorage yields the parts of sorted rows that share a table, in order.
func byStorage(rows []Row) func(yield func(Storage, []Row) bool) {
	return func(yield func(Storage, []Row) bool) {
		for len(rows) > 0 {
			n := 1
			for n < len(rows) && rows[n].Storage == rows[0].Storage {
				n++
			}
			if !yield(rows[0].Storage, rows[:n]) {
				return
			}
			rows = rows[n:]
		}
	}
}

// storageRows returns the rows of sorted rows that are of storage s.
func storageRows(rows []Row, s Storage) []Row {
	for t, part := range byStorage(rows) {
		if t == s {
			return part
		}
	}
	return nil
}

// Array parameters are texts, int64s and times (params.go): a batch's
// arrays are only ever sent through pgx (see Postgres.Shape).

func prefixArray(rows []Row) texts { return column(rows, func(r Row) string { return r.Prefix }) }

func keyArray(rows []Row) texts { return column(rows, func(r Row) string { return r.Key }) }

// horizonArray is each row's horizon (see Plan.Interval).
func horizonArray(rows []Row, a *Attempt) durations {
	return column(rows, func(r Row) time.Duration { return a.horizons[r] })
}

// column is f of each of rows, an array parameter.
func column[R, T any](rows []R, f func(R) T) []T {
	out := make([]T, len(rows))
	for i, r := range rows {
		out[i] = f(r)
	}
	return out
}

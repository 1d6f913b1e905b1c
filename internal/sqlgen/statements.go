// Package sqlgen holds every SQL text of pgratelimit: the statements of a
// check in their two shapes (one row per statement, or arrays), over any
// bucket table (a shard's too), and those of grants, request IDs and the
// ledger; plus the encoders of the text parameters they take. It returns
// strings only; the engine runs them.
package sqlgen

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of a check, for one bucket table, in the two shapes a
// transaction's statements take (see shape.go): one statement per row with
// scalar parameters, or one statement over all of a table's rows as arrays.
//
// One's times travel as text parameters (RFC 3339) cast in SQL: the same
// statements then run unchanged on pgx and on any database/sql driver, in
// every pgx query mode, and behind PgBouncer. Many's arrays are typed
// arrays (text[], bigint[], timestamptz[]) that pgx sends in binary where
// it knows their types, so the server does not parse them, and as array
// literals where it does not (internal/engine's params.go): array
// statements run only in the engine's own transactions, on pgx, in any
// query mode. $1 and $2 are always the rows' prefixes and keys (arrays of
// them, or one of each).
type Statements struct {
	One, Many Table
	// citus are one's statements as Citus can plan them once and route
	// them to one shard (see citusRow): the lock a plain SELECT of one
	// table, and no clock in any of them (a volatile function stops Citus
	// caching a plan).
	Citus Table

	// peek reads one row without locking it.
	Peek string
	// remove deletes one row (Reset).
	Remove string
	// Mark writes the override columns of one row ($1, $2), if it exists:
	// ov_capacity $3 and ov_refill $4 (NULL: no override), ov_until $5 (''
	// for none), so that the row's copy is known. SetOverride and
	// ClearOverride, under the row's lock; and a check's write of a row
	// whose copy its lock found unknown.
	Mark string
	// Hold locks one row ($1, $2), if it exists: the other table's row
	// that a Mark writes later in the transaction, locked in the rows'
	// order (see engine.Attempt.holdOthers).
	Hold string
}

// Table is the statements of a transaction over rows of one table.
type Table struct {
	// insert creates the missing rows as placeholders: refilled_at is the
	// zero time, which every check reads exactly as a missing row (a full
	// bucket whose grid starts at the clock read after the row lock). The
	// check that inserts one then writes its real state; a check that ends
	// without writing (denied by another bucket of an AllowAll, or given up)
	// leaves nothing that changes a later decision. expires_at is already
	// what the first check will compute ($3: how long after it the bucket is
	// full again, rounded up to the minute from the transaction's clock), so
	// that check's UPDATE most often leaves it alone.
	Insert string
	// guardedInsert (one row) is insert after a routed transaction's guard
	// on Citus (shardRows.guard): lock_shard_metadata on the shards $5.
	GuardedInsert string
	// lock and lockSkip lock the rows one by one in the order given, which
	// is (prefix, key) order, and read them with the clock ($3, or the
	// database's clock_timestamp() read after each lock). lockSkip skips rows
	// that another transaction holds: coalesced batches never wait for a row
	// lock. Over arrays (Statements.Many) they return each row's position in
	// the arrays (from 1) instead of its prefix and key, which the engine
	// has: no strings to send back and read.
	Lock, LockSkip string
	// relock is lock for rows that vanished between insert and lock (a
	// cleanup deleted them): an upsert, which always returns the row, locked.
	Relock string
	// update writes the rows a check changed.
	//
	// Over arrays (Statements.Many), lock and relock also return each row's
	// ctid, just before the clock, and update finds the rows by it alone: a
	// TID scan, not a third search of the primary key (a microsecond and a
	// half of server CPU a check, issue #44; with the keys in its WHERE as
	// well, the planner may search the key again). The transaction holds
	// the rows' locks from the lock on, so no other transaction moves them,
	// and this update is its first write of them: the ctids it read are
	// its rows' current versions. A stale one would match no row, and the
	// engine counts the rows changed (engine.Stmt.Changes).
	Update string
	// UpdateData (in the Data variants only) writes rows' leases column
	// (NULL for "") and moves each row's expiry to at least a time: the
	// write of a Part's decisions (see internal/lease), on rows whose
	// balance it never touches. One row: ($1, $2, leases, expires_at);
	// over arrays, as Update: the rows' ctids, then the leases and the
	// expiries. It is the lease operations' only write, on the rows they
	// locked: also what makes a transaction under REPEATABLE READ or
	// SERIALIZABLE that locked a row with an older snapshot fail with a
	// serialization error rather than decide on leases it cannot see.
	UpdateData string
	// lockGrants, lockSkipGrants and relockGrants are lock, lockSkip and
	// relock that also read the key's grants (amount > 0; expiry is judged
	// in Go, by the check's clock), locked, only for the rows whose lock
	// they hold: a row per grant, or one with NULL grant columns. The
	// statements of a transaction that charges a limiter with
	// Config.Grants.
	LockGrants, LockSkipGrants, RelockGrants string
	// Data are these statements also reading each row's leases column,
	// after capacity (a key's concurrency leases, NULL for a bucket: see
	// internal/lease): the statements of a transaction with charges of a
	// Part, which reads them under the lock, in the same statement. A
	// transaction of checks alone reads no more than it needs.
	Data *Table
	// Overrides are these statements also reading each row's override,
	// after capacity and the leases column: the row's copy of it (its
	// ov_capacity, ov_refill and ov_until columns), as of its lock (FOR
	// UPDATE under READ COMMITTED returns the newest committed version of
	// the row it locks), which every writer of an override writes under
	// that lock (Statements.Mark); and, for a row whose copy is unknown
	// (ov_capacity Unknown: a row made since by any check, or before the
	// copy existed), the key's override read after the lock (see ovCols).
	// Their Insert and Update are the plain ones: the engine writes the
	// resolved copy of a row that was unknown with Mark, after the row's
	// UPDATE, so the row is known from then on. The statements of a
	// transaction with a charge of a limiter with Config.Overrides; nil for
	// Citus's, which reads overrides in statements of their own
	// (Overrides.Read).
	Overrides *Table
}

// placeholderTime is the refilled_at of a placeholder row: Go's zero time,
// before any clock a check can read.
const placeholderTime = `timestamptz '0001-01-01 00:00:00+00'`

// expiryOf is the expires_at of a new row: the transaction's clock ($4, or
// now()) plus its horizon, rounded up to the minute as bucket.expiry does.
func expiryOf(horizon string) string {
	return `date_bin('1 minute', COALESCE($4::timestamptz, now()) + ` + horizon + ` + interval '59.999999 seconds', timestamptz 'epoch')`
}

// dbClock3 and dbClock4 are the clock a statement reads: the parameter ($3
// or $4) when the limiter has a clock, else the database's, read then (after
// the lock of the row it is read with).
const (
	dbClock3 = `COALESCE($3::timestamptz, clock_timestamp())`
	dbClock4 = `COALESCE($4::timestamptz, clock_timestamp())`
	// noClock3 and noClock4 are the parameter, else the epoch: the
	// database's clock is read by a statement of its own (see citusRow).
	noClock3 = `COALESCE($3::timestamptz, timestamptz 'epoch')`
	noClock4 = `COALESCE($4::timestamptz, timestamptz 'epoch')`
)

// Buckets returns the statements of the bucket table t, a name as
// SQL takes it (quoted, maybe schema-qualified). extra, if not empty, is
// one more column (", expression") that one's lock and relock return after
// the clock (a Citus shard's placement check, see shardRows).
func Buckets(t, extra string) Statements {
	return Statements{
		Many:  variants(func(data, ov bool) Table { return manyRows(t, data, ov) }, true),
		One:   variants(func(data, ov bool) Table { return oneRow(t, extra, data, ov) }, extra == ""),
		Citus: variants(func(data, _ bool) Table { return citusRow(t, data) }, false),
		Peek: `SELECT b.tokens, b.refilled_at, b.expires_at, b.capacity, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT 1) one LEFT JOIN ` + t + ` b ON b.prefix = $1 AND b.key = $2`,
		Remove: `DELETE FROM ` + t + ` WHERE prefix = $1 AND key = $2`,
		Mark: `UPDATE ` + t + ` SET ov_capacity = $3, ov_refill = $4, ov_until = NULLIF($5, '')::timestamptz
WHERE prefix = $1 AND key = $2`,
		Hold: `SELECT 1 FROM ` + t + ` WHERE prefix = $1 AND key = $2 FOR UPDATE`,
	}
}

// grantCols are the grant columns the locks with grants return.
const grantCols = `, g.id, g.amount, g.expires_at, g.ledger`

// grantsOf joins the grants of the rows named b (or r: arrays) that the
// statement holds.
func grantsOf(b string) string {
	return `
LEFT JOIN LATERAL (SELECT id, amount, expires_at, ledger FROM ` + pgx.Identifier{GrantsTable}.Sanitize() + `
                   WHERE prefix = ` + b + `.prefix AND key = ` + b + `.key AND amount > 0 FOR UPDATE) g ON true`
}

// variant is lock statement q (with %[1]s for SKIP LOCKED, %[2]s and %[3]s
// for the grants' columns and join) skipping locked rows or not, with the
// grants of its rows or not.
func variant(q, skip string, grants bool) string {
	if grants {
		alias := "b"
		if strings.Contains(q, "AS r(prefix, key") {
			alias = "r"
		}
		return fmt.Sprintf(q, skip, grantCols, grantsOf(alias))
	}
	return fmt.Sprintf(q, skip, "", "")
}

// relock upserts rows of values into t, returning them locked with clock
// (and their leases column after capacity, with data; their override,
// resolved, after them, with ov; and their ctid before the clock, with
// tid).
func relock(t, values, clock string, tid, data, ov bool) string {
	q := `INSERT INTO ` + t + ` AS b (prefix, key, tokens, refilled_at, expires_at)
` + values + `
ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens
RETURNING b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, b.capacity` + dataCol("b", data)
	if !ov {
		return q + ctidCol("b", tid) + `, ` + clock
	}
	return `WITH b AS (` + q + `, b.ov_capacity, b.ov_refill, b.ov_until` + ctidCol("b", tid) + `, ` + clock + ` AS clock)
SELECT b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, b.capacity` + dataCol("b", data) + ovCols("b", "b") + ctidCol("b", tid) + `, b.clock
FROM b`
}

// relockGrants is relock with the rows' grants.
func relockGrants(t, values string, tid, data, ov bool) string {
	if ov {
		return `WITH b AS (` + relock(t, values, dbClock4, tid, data, false) + ` AS clock, b.ov_capacity, b.ov_refill, b.ov_until)
SELECT b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, b.capacity` + dataCol("b", data) + ovCols("b", "b") + ctidCol("b", tid) + `, b.clock` + grantCols + `
FROM b` + grantsOf("b")
	}
	return `WITH b AS (` + relock(t, values, dbClock4, tid, data, false) + ` AS clock)
SELECT b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, b.capacity` + dataCol("b", data) + ctidCol("b", tid) + `, b.clock` + grantCols + `
FROM b` + grantsOf("b")
}

// ctidCol is ", " and the ctid of the rows named alias with tid; else
// nothing.
func ctidCol(alias string, tid bool) string {
	if !tid {
		return ""
	}
	return ", " + alias + ".ctid"
}

// OverrideFunc is the function that reads a key's override with a
// snapshot of its own (migration 00010).
const OverrideFunc = "pgratelimit_override"

// Unknown is the ov_capacity of a bucket row whose copy of its key's
// override is unknown: the column's default, so every row a check makes
// (and every row written before the copy existed) is unknown until a check
// of a limiter with Config.Overrides writes it, or SetOverride or
// ClearOverride does.
const Unknown = -1

// ovCols are the override columns of the rows named alias: the row's copy
// (ov_capacity, ov_refill, ov_until: ov_capacity NULL for none, Unknown
// for unknown), then, for a row whose copy is unknown, and only for those,
// the key's override as pgratelimit_override reads it (the empty string for none, else
// "capacity refill until", until in microseconds since the epoch or "-"),
// NULL for a known row. The function is VOLATILE, so it reads with a
// snapshot taken when it runs, after the row's lock (a join on the table
// would read the statement's, taken before the lock was waited for); in a
// CASE of the select list it runs for the rows whose copy is unknown, and
// a known row costs a comparison (a lateral join of it cost every row a
// rescan: about 2 µs of server CPU per check). keys names the relation of
// the rows' prefix and key.
func ovCols(alias, keys string) string {
	return `, ` + alias + `.ov_capacity, ` + alias + `.ov_refill, ` + alias + `.ov_until, CASE WHEN ` + alias + `.ov_capacity = ` +
		strconv.Itoa(Unknown) + ` THEN ` + pgx.Identifier{OverrideFunc}.Sanitize() + `(` + keys + `.prefix, ` + keys + `.key) END`
}

// dataCol is ", " and the leases column of the rows named alias ("":
// unqualified) with data; else nothing.
func dataCol(alias string, data bool) string {
	switch {
	case !data:
		return ""
	case alias == "":
		return ", leases"
	}
	return ", " + alias + ".leases"
}

// variants returns f's statements with their Data (reading the leases
// column) and, with ov, their Overrides (reading the rows' overrides; the
// Data's too).
func variants(f func(data, ov bool) Table, ov bool) Table {
	ts, data := f(false, false), f(true, false)
	if ov {
		o, do := f(false, true), f(true, true)
		ts.Overrides, data.Overrides = &o, &do
	}
	ts.Data = &data
	return ts
}

// newOne is the values of one new row ($1, $2, its horizon $3).
const newOne = `$1, $2, 0, ` + placeholderTime + `, `

// ovSelect is ", " and the override columns of a row, unqualified, with ov;
// else nothing.
func ovSelect(ov bool) string {
	if ov {
		return ", ov_capacity, ov_refill, ov_until"
	}
	return ""
}

// manyRows are the statements over all of a table's rows as arrays (with
// data, reading the leases column; with ov, the rows' overrides).
func manyRows(t string, data, ov bool) Table {
	lock := `SELECT r.i, t.tokens, t.refilled_at, t.expires_at, t.capacity` + dataCol("t", data) + `%[4]s, t.ctid, ` + dbClock3 + `%[2]s
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r(prefix, key, i),
LATERAL (SELECT tokens, refilled_at, expires_at, capacity` + dataCol("", data) + ovSelect(ov) + `, ctid FROM ` + t + `
         WHERE prefix = r.prefix AND key = r.key FOR UPDATE%[1]s) t%[3]s`
	lock = withOv(lock, ov, ovCols("t", "r"))
	rows := `SELECT r.prefix, r.key, 0, ` + placeholderTime + `, ` + expiryOf("r.h") + `
FROM unnest($1::text[], $2::text[], $3::interval[]) WITH ORDINALITY AS r(prefix, key, h, i)`
	values := rows + `
ORDER BY r.i`
	// The INSERT passes over the rows its snapshot sees, most of a busy
	// table's: a plain index probe costs less than a speculative
	// insertion's conflict check (1.4 against 1.9 µs a row, issue #44),
	// and a row that another transaction is updating is left to the lock
	// rather than waited for. A row deleted since the snapshot is missing
	// at the lock, as when a cleanup deletes it between the INSERT and the
	// lock: the relock inserts it, or the batch defers its checks.
	absent := rows + `
WHERE NOT EXISTS (SELECT FROM ` + t + ` AS e WHERE e.prefix = r.prefix AND e.key = r.key)
ORDER BY r.i`
	update := `UPDATE ` + t + ` AS t SET tokens = r.tokens, refilled_at = r.refilled_at, expires_at = r.expires_at, capacity = r.capacity
FROM unnest($1::tid[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::bigint[])
     AS r(ctid, tokens, refilled_at, expires_at, capacity)
WHERE t.ctid = r.ctid`
	return Table{
		Insert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
` + absent + `
ON CONFLICT (prefix, key) DO NOTHING`,
		Lock:           variant(lock, "", false),
		LockSkip:       variant(lock, " SKIP LOCKED", false),
		LockGrants:     variant(lock, "", true),
		LockSkipGrants: variant(lock, " SKIP LOCKED", true),
		Relock:         relock(t, values, dbClock4, true, data, ov),
		RelockGrants:   relockGrants(t, values, true, data, ov),
		Update:         update,
		UpdateData: ifData(data, `UPDATE `+t+` AS t SET leases = NULLIF(r.leases, '')::json, expires_at = greatest(t.expires_at, r.expires_at)
FROM unnest($1::tid[], $2::text[], $3::timestamptz[]) AS r(ctid, leases, expires_at)
WHERE t.ctid = r.ctid`),
	}
}

// ifData is q with data; else nothing.
func ifData(data bool, q string) string {
	if !data {
		return ""
	}
	return q
}

// withOv fills lock statement q's %[4]s (after capacity and the leases
// column) with cols with ov; else with nothing.
func withOv(q string, ov bool, cols string) string {
	if !ov {
		cols = ""
	}
	return strings.ReplaceAll(q, "%[4]s", cols)
}

// oneRow are the statements of one row with scalar parameters; extra, if
// not empty, is one more column that the lock and relock return after the
// clock (with data, the leases column after capacity; with ov, the row's
// override after them).
func oneRow(t, extra string, data, ov bool) Table {
	lock := `SELECT b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, b.capacity` + dataCol("b", data) + `%[4]s, ` + dbClock3 + extra + `%[2]s
FROM (SELECT prefix, key, tokens, refilled_at, expires_at, capacity` + dataCol("", data) + ovSelect(ov) + ` FROM ` + t + `
      WHERE prefix = $1 AND key = $2 FOR UPDATE%[1]s) b%[3]s`
	lock = withOv(lock, ov, ovCols("b", "b"))
	values := `VALUES (` + newOne + expiryOf("$3::text::interval") + `)`
	update := `UPDATE ` + t + ` SET tokens = $3, refilled_at = $4, expires_at = $5, capacity = $6 WHERE prefix = $1 AND key = $2`
	return Table{
		Insert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
` + values + `
ON CONFLICT (prefix, key) DO NOTHING`,
		GuardedInsert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT ` + newOne + expiryOf("$3::text::interval") + ` FROM pg_catalog.lock_shard_metadata(5, $5::text::bigint[])
ON CONFLICT (prefix, key) DO NOTHING`,
		Lock:           variant(lock, "", false),
		LockSkip:       variant(lock, " SKIP LOCKED", false),
		LockGrants:     variant(lock, "", true),
		LockSkipGrants: variant(lock, " SKIP LOCKED", true),
		Relock:         relock(t, values, dbClock4+extra, false, data, ov),
		RelockGrants:   relockGrants(t, values, false, data, ov),
		Update:         update,
		UpdateData: ifData(data, `UPDATE `+t+` SET leases = NULLIF($3::text, '')::json, expires_at = greatest(expires_at, $4::timestamptz)
WHERE prefix = $1 AND key = $2`),
	}
}

// citusRow are oneRow's locks as Citus's fast path plans them (one table,
// no subquery, no clock: a volatile function stops Citus caching a plan);
// it inserts and updates with oneRow's. Citus cannot plan the lateral join
// of grants: the engine reads them in statements of their own
// (Grants.LockOne).
func citusRow(t string, data bool) Table {
	lock := `SELECT prefix, key, tokens, refilled_at, expires_at, capacity` + dataCol("", data) + `, ` + noClock3 + ` FROM ` + t + `
WHERE prefix = $1 AND key = $2 FOR UPDATE%[1]s`
	return Table{
		Lock:     variant(lock, "", false),
		LockSkip: variant(lock, " SKIP LOCKED", false),
		Relock:   relock(t, `VALUES (`+newOne+expiryOf("$3::text::interval")+`)`, noClock4, false, data, false),
	}
}

// TextArray encodes n elements as a PostgreSQL array literal, each element
// double-quoted (keys may hold any character but NUL).
func TextArray(n int, elem func(i int) string) string {
	return array(n, func(b []byte, i int) []byte {
		s := elem(i)
		b = append(b, '"')
		for j := 0; j < len(s); j++ { // '"' and '\\' never occur inside a UTF-8 sequence
			if s[j] == '"' || s[j] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, s[j])
		}
		return append(b, '"')
	})
}

// Int64Array encodes n integers as a PostgreSQL array literal.
func Int64Array(n int, elem func(i int) int64) string {
	return array(n, func(b []byte, i int) []byte { return strconv.AppendInt(b, elem(i), 10) })
}

// TimeArray encodes times in UTC with microseconds, PostgreSQL's resolution.
// The times of a batch repeat (one grid, one expiry minute): a time equal to
// the one before is copied rather than formatted again.
func TimeArray(n int, elem func(i int) time.Time) string {
	var last time.Time
	var lastAt, lastEnd int
	return array(n, func(b []byte, i int) []byte {
		t := elem(i).UTC().Truncate(time.Microsecond)
		if i > 0 && t.Equal(last) {
			return append(b, b[lastAt:lastEnd]...)
		}
		last, lastAt = t, len(b)
		b = append(b, '"')
		b = t.AppendFormat(b, "2006-01-02 15:04:05.999999Z07:00")
		b = append(b, '"')
		lastEnd = len(b)
		return b
	})
}

// array encodes n elements, each appended by elem, as an array literal.
func array(n int, elem func(b []byte, i int) []byte) string {
	b := make([]byte, 0, 2+n*24)
	b = append(b, '{')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, i)
	}
	return string(append(b, '}'))
}

// Interval encodes a duration as PostgreSQL interval input, in hours and
// seconds: PostgreSQL 14 reads each field of interval input as a 32-bit
// integer, so "3600000000 microseconds" (an hour) is out of range there,
// while a Duration's ~2.56 million hours fit.
func Interval(d time.Duration) string {
	us := d.Microseconds()
	h, rest := us/3_600_000_000, us%3_600_000_000
	b := make([]byte, 0, 40)
	b = strconv.AppendInt(b, h, 10)
	b = append(b, " hours "...)
	b = strconv.AppendInt(b, rest/1_000_000, 10)
	b = append(b, '.')
	frac := strconv.AppendInt(make([]byte, 0, 8), 1_000_000+rest%1_000_000, 10) // 1 and six digits
	b = append(b, frac[1:]...)
	return string(append(b, " seconds"...))
}

// GrantsTable is the table of grants, created by the migrations.
const GrantsTable = "pgratelimit_grants"

// GrantStatements are the statements of the grants table beside a check's
// (which reads grants with the bucket rows, see lockGrants). A grant's
// expires_at is NULL when it never expires.
type GrantStatements struct {
	// lockOne and lockOneSkip read a key's grants, locked (lockGrants as a
	// statement of its own, for Citus).
	LockOne, LockOneSkip string
	// write sets the amounts of grants a transaction changed, making again
	// those that a refund gives credits back to after cleanup deleted them
	// spent, and inserting new ones: (prefix, key, id, amount, expires_at
	// as text, '' for NULL, granted_at, ledger as 0 or 1).
	Write Rows
	// nextID reads a new grant's ID from the table's identity.
	NextID string
	// list reads a key's grants with credits left (live or not).
	List string
}

// Grants are the statements of the grants table.
var Grants = func() GrantStatements {
	t := pgx.Identifier{GrantsTable}.Sanitize()
	lock := `SELECT prefix, key, id, amount, expires_at, ledger FROM ` + t + ` WHERE prefix = $1 AND key = $2 AND amount > 0 FOR UPDATE`
	return GrantStatements{
		LockOne:     lock,
		LockOneSkip: lock + ` SKIP LOCKED`,
		Write: Rows{
			One: `INSERT INTO ` + t + ` (prefix, key, id, amount, expires_at, granted_at, ledger)
VALUES ($1, $2, $3, $4, NULLIF($5, '')::timestamptz, $6::text::timestamptz, $7 <> 0)
ON CONFLICT (prefix, key, id) DO UPDATE SET amount = excluded.amount`,
			Many: `INSERT INTO ` + t + ` (prefix, key, id, amount, expires_at, granted_at, ledger)
SELECT prefix, key, id, amount, NULLIF(exp, '')::timestamptz, at, ledger <> 0
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[],
            $6::timestamptz[], $7::bigint[]) AS r(prefix, key, id, amount, exp, at, ledger)
ON CONFLICT (prefix, key, id) DO UPDATE SET amount = excluded.amount`,
		},
		NextID: `SELECT nextval(pg_get_serial_sequence($1, 'id'))`,
		List: `SELECT id, amount, expires_at, granted_at, ledger FROM ` + t + `
WHERE prefix = $1 AND key = $2 AND amount > 0`,
	}
}()

// The tables, created by the migrations in package migrations.
const (
	DurableTable   = "pgratelimit_buckets"
	EphemeralTable = "pgratelimit_ephemeral_buckets"
	RequestsTable  = "pgratelimit_requests"
	LedgerTable    = "pgratelimit_ledger"
)

// Durable and Ephemeral are the statements of the two bucket tables.
var (
	Durable   = Buckets(pgx.Identifier{DurableTable}.Sanitize(), "")
	Ephemeral = Buckets(pgx.Identifier{EphemeralTable}.Sanitize(), "")
)

// SetConfig is a statement that sets n settings (1 to 6) for the
// transaction: $1 to $2, $3 to $4, and so on.
func SetConfig(n int) string { return setConfigs[n] }

// setConfigs holds the statement for every number of settings a
// transaction can have (the array shape's four, lock_timeout and
// synchronous_commit).
var setConfigs = func() (sqls [7]string) {
	for n := 1; n < len(sqls); n++ {
		calls := make([]string, n)
		for i := range calls {
			calls[i] = fmt.Sprintf("set_config($%d, $%d, true)", 2*i+1, 2*i+2)
		}
		sqls[n] = "SELECT " + strings.Join(calls, ", ")
	}
	return sqls
}()

// Rows is a statement over rows of values in the two shapes (see
// shape.rows): one takes one row's values as $1, $2, ...; many takes each
// column as an array.
type Rows struct{ One, Many string }

// Notify sends notifications (channel, payload), in the transaction, so
// that PostgreSQL delivers them when it commits, and only then: a lease's
// release, the events an alert wrote.
var Notify = Rows{
	One:  `SELECT pg_notify($1, $2)`,
	Many: `SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS r(c, p)`,
}

// NotifyUnbounded is Notify in a transaction of our own: it also lifts the
// transaction's lock_timeout, which bounds its waits for row locks, so that
// its COMMIT's wait for the notification queue lock (every notifying
// transaction of the cluster takes it in turn) is never cut short.
var NotifyUnbounded = Rows{
	One:  `SELECT pg_notify($1, $2), set_config('lock_timeout', '0', true)`,
	Many: `SELECT pg_notify(c, p), set_config('lock_timeout', '0', true) FROM unnest($1::text[], $2::text[]) AS r(c, p)`,
}

// Requests and Ledger are the statements of request IDs and the
// ledger. A request row holds its record (see record.go): kind, cost (the
// amount), the first outcome's remaining and granted, settled (NULL, or the
// actual cost), and the rest in detail, JSON.
var Requests, Ledger = func() (req struct {
	Read, Write Rows
	Get, List   string
}, led struct {
	Write Rows
	List  string
}) {
	r := pgx.Identifier{RequestsTable}.Sanitize()
	l := pgx.Identifier{LedgerTable}.Sanitize()
	const cols = `prefix, key, request_id, kind, cost, remaining, granted, settled, detail, created_at, expires_at`
	req.Read = Rows{
		One: `SELECT ` + cols + ` FROM ` + r + `
WHERE prefix = $1 AND key = $2 AND request_id = $3`,
		Many: `SELECT q.prefix, q.key, q.request_id, q.kind, q.cost, q.remaining, q.granted, q.settled, q.detail, q.created_at, q.expires_at
FROM unnest($1::text[], $2::text[], $3::text[]) AS x(prefix, key, request_id)
JOIN ` + r + ` q ON q.prefix = x.prefix AND q.key = x.key AND q.request_id = x.request_id`,
	}
	req.Get = req.Read.One
	req.List = `SELECT ` + cols + ` FROM ` + r + `
WHERE prefix = $1 AND key = $2 AND request_id > $3 ORDER BY request_id LIMIT $4`
	const set = `ON CONFLICT (prefix, key, request_id) DO UPDATE SET kind = excluded.kind, cost = excluded.cost,
    remaining = excluded.remaining, granted = excluded.granted, settled = excluded.settled, detail = excluded.detail,
    created_at = excluded.created_at, expires_at = excluded.expires_at`
	req.Write = Rows{
		One: `INSERT INTO ` + r + ` (` + cols + `)
VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, -1), $9, $10::text::timestamptz, $11::text::timestamptz)
` + set,
		Many: `INSERT INTO ` + r + ` (` + cols + `)
SELECT prefix, key, request_id, kind, cost, remaining, granted, NULLIF(settled, -1), detail, created_at, expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
            $7::bigint[], $8::bigint[], $9::text[], $10::timestamptz[], $11::timestamptz[])
     AS x(prefix, key, request_id, kind, cost, remaining, granted, settled, detail, created_at, expires_at)
` + set,
	}
	led.Write = Rows{
		One: `INSERT INTO ` + l + ` (prefix, key, at, amount, kind, request_id, balance, grants_amount, granted)
VALUES ($1, $2, $3::text::timestamptz, $4, $5, NULLIF($6, ''), $7, $8, $9)`,
		Many: `INSERT INTO ` + l + ` (prefix, key, at, amount, kind, request_id, balance, grants_amount, granted)
SELECT prefix, key, at, amount, kind, NULLIF(request_id, ''), balance, grants_amount, granted
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[], $5::text[],
            $6::text[], $7::bigint[], $8::bigint[], $9::bigint[])
     AS x(prefix, key, at, amount, kind, request_id, balance, grants_amount, granted)`,
	}
	led.List = `SELECT id, at, amount, kind, COALESCE(request_id, ''), balance, grants_amount, COALESCE(granted, 0) FROM ` + l + `
WHERE prefix = $1 AND key = $2 AND at >= $3::text::timestamptz ORDER BY at, id`
	return req, led
}()

// Clock reads the database's clock, for shapes whose locking statements do
// not (Citus through the coordinator).
const Clock = `SELECT clock_timestamp()`

// LockShards takes the metadata locks of the Citus shards $1 (an array of
// shard IDs), ShareLock: what Citus's executor takes before it writes to a
// shard, and what a shard move waits for.
const LockShards = `SELECT pg_catalog.lock_shard_metadata(5, $1::text::bigint[])`

// Placed is an expression that counts the placements of Citus shard shard
// on the node group group: 1 while that node holds it, 0 once it moved.
func Placed(shard int64, group int32) string {
	return fmt.Sprintf(`(SELECT count(*) FROM pg_catalog.pg_dist_placement WHERE shardid = %d AND groupid = %d)`, shard, group)
}

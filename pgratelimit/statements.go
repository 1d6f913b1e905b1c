package pgratelimit

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of a check, for one bucket table, in the two shapes a
// transaction's statements take (see shape.go): one statement per row with
// scalar parameters, or one statement over all of a table's rows as arrays.
//
// Arrays and times travel as text parameters (PostgreSQL array literals,
// RFC 3339 times) cast in SQL: the same statements then run unchanged on pgx
// and on any database/sql driver, in every pgx query mode, and behind
// PgBouncer. $1 and $2 are always the rows' prefixes and keys (arrays of
// them, or one of each).
type statements struct {
	one, many tableStatements

	// peek reads one row without locking it.
	peek string
	// remove deletes one row (Reset).
	remove string
}

// tableStatements are the statements of a transaction over rows of one table.
type tableStatements struct {
	// insert creates the missing rows as placeholders: refilled_at is the
	// zero time, which every check reads exactly as a missing row (a full
	// bucket whose grid starts at the clock read after the row lock). The
	// check that inserts one then writes its real state; a check that ends
	// without writing (denied by another bucket of an AllowAll, or given up)
	// leaves nothing that changes a later decision. expires_at is already
	// what the first check will compute ($3: how long after it the bucket is
	// full again, rounded up to the minute from the transaction's clock), so
	// that check's UPDATE leaves the indexed column alone and stays HOT.
	insert string
	// lock and lockSkip lock the rows one by one in the order given, which
	// is (prefix, key) order, and read them with the clock ($3, or the
	// database's clock_timestamp() read after each lock). lockSkip skips rows
	// that another transaction holds: coalesced batches never wait for a row
	// lock.
	lock, lockSkip string
	// relock is lock for rows that vanished between insert and lock (a
	// cleanup deleted them): an upsert, which always returns the row, locked.
	relock string
	// update writes the rows a check changed.
	update string
}

// placeholderTime is the refilled_at of a placeholder row: Go's zero time,
// before any clock a check can read.
const placeholderTime = `timestamptz '0001-01-01 00:00:00+00'`

// expiryOf is the expires_at of a new row: the transaction's clock ($4, or
// now()) plus its horizon, rounded up to the minute as bucket.expiry does.
func expiryOf(horizon string) string {
	return `date_bin('1 minute', COALESCE($4::timestamptz, now()) + ` + horizon + ` + interval '59.999999 seconds', timestamptz 'epoch')`
}

func newStatements(table string) statements {
	t := pgx.Identifier{table}.Sanitize()
	rows := `unnest($1::text::text[], $2::text::text[])`
	rowsH := `unnest($1::text::text[], $2::text::text[], $3::text::interval[])`
	lock := `SELECT r.prefix, r.key, t.tokens, t.refilled_at, t.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM ` + rows + ` AS r(prefix, key),
LATERAL (SELECT tokens, refilled_at, expires_at FROM ` + t + `
         WHERE prefix = r.prefix AND key = r.key FOR UPDATE%s) t`
	lock1 := `SELECT b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT prefix, key, tokens, refilled_at, expires_at FROM ` + t + `
      WHERE prefix = $1 AND key = $2 FOR UPDATE%s) b`
	return statements{
		many: tableStatements{
			insert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT r.prefix, r.key, 0, ` + placeholderTime + `, ` + expiryOf("r.h") + `
FROM ` + rowsH + ` WITH ORDINALITY AS r(prefix, key, h, i)
ORDER BY r.i
ON CONFLICT (prefix, key) DO NOTHING`,
			lock:     strings.Replace(lock, "%s", "", 1),
			lockSkip: strings.Replace(lock, "%s", " SKIP LOCKED", 1),
			relock: `INSERT INTO ` + t + ` AS b (prefix, key, tokens, refilled_at, expires_at)
SELECT r.prefix, r.key, 0, ` + placeholderTime + `, ` + expiryOf("r.h") + `
FROM ` + rowsH + ` WITH ORDINALITY AS r(prefix, key, h, i)
ORDER BY r.i
ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens
RETURNING b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, COALESCE($4::timestamptz, clock_timestamp())`,
			update: `UPDATE ` + t + ` AS t SET tokens = r.tokens, refilled_at = r.refilled_at, expires_at = r.expires_at
FROM unnest($1::text::text[], $2::text::text[], $3::text::bigint[], $4::text::timestamptz[], $5::text::timestamptz[])
     AS r(prefix, key, tokens, refilled_at, expires_at)
WHERE t.prefix = r.prefix AND t.key = r.key`,
		},
		one: tableStatements{
			insert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
VALUES ($1, $2, 0, ` + placeholderTime + `, ` + expiryOf("$3::text::interval") + `)
ON CONFLICT (prefix, key) DO NOTHING`,
			lock:     strings.Replace(lock1, "%s", "", 1),
			lockSkip: strings.Replace(lock1, "%s", " SKIP LOCKED", 1),
			relock: `INSERT INTO ` + t + ` AS b (prefix, key, tokens, refilled_at, expires_at)
VALUES ($1, $2, 0, ` + placeholderTime + `, ` + expiryOf("$3::text::interval") + `)
ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens
RETURNING b.prefix, b.key, b.tokens, b.refilled_at, b.expires_at, COALESCE($4::timestamptz, clock_timestamp())`,
			update: `UPDATE ` + t + ` SET tokens = $3, refilled_at = $4, expires_at = $5 WHERE prefix = $1 AND key = $2`,
		},
		peek: `SELECT b.tokens, b.refilled_at, b.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT 1) one LEFT JOIN ` + t + ` b ON b.prefix = $1 AND b.key = $2`,
		remove: `DELETE FROM ` + t + ` WHERE prefix = $1 AND key = $2`,
	}
}

// textArray encodes n elements as a PostgreSQL array literal, each element
// double-quoted (keys may hold any character but NUL).
func textArray(n int, elem func(i int) string) string {
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

func int64Array(n int, elem func(i int) int64) string {
	return array(n, func(b []byte, i int) []byte { return strconv.AppendInt(b, elem(i), 10) })
}

// timeArray encodes times in UTC with microseconds, PostgreSQL's resolution.
// The times of a batch repeat (one grid, one expiry minute): a time equal to
// the one before is copied rather than formatted again.
func timeArray(n int, elem func(i int) time.Time) string {
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

// interval encodes a duration as PostgreSQL interval input, in hours and
// seconds: PostgreSQL 14 reads each field of interval input as a 32-bit
// integer, so "3600000000 microseconds" (an hour) is out of range there,
// while a Duration's ~2.56 million hours fit.
func interval(d time.Duration) string {
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

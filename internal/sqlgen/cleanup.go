package sqlgen

import (
	"strings"
	"time"
)

// CleanupTable is a table cleanup deletes dead rows of.
type CleanupTable struct {
	Name string
	// Dead is the SQL condition of the rows to delete, given the SQL of
	// the time.
	Dead func(now string) string
	// Order is the ORDER BY of the rows to delete first, which an index
	// serves; "" walks the table by ranges of pages instead.
	Order string
}

// CleanupTables are what cleanup deletes: buckets full again (expired),
// (with the leases they remember: every lease of the row is then dead, see
// internal/lease), grants spent or expired, request IDs past their
// retention, with a ledgerRetention ledger rows older than it, the alert
// state of periods that have ended, and, with an eventRetention, events
// delivered longer ago than it (never undelivered ones).
func CleanupTables(ledgerRetention, eventRetention time.Duration) []CleanupTable {
	expired := func(now string) string { return "expires_at <= " + now }
	ts := []CleanupTable{
		{Name: DurableTable, Dead: expired},
		{Name: EphemeralTable, Dead: expired},
		// An expired grant of a limiter with a ledger stays until an
		// operation on its key has written its "expire" row (and set its
		// amount to 0).
		{Name: GrantsTable, Dead: func(now string) string { return "(amount = 0 OR expires_at <= " + now + " AND NOT ledger)" }},
		{Name: RequestsTable, Dead: expired, Order: "ORDER BY expires_at"},
	}
	if ledgerRetention > 0 {
		age := "interval '" + Interval(ledgerRetention) + "'" // hours and seconds: PostgreSQL 14 reads each field as 32 bits
		ts = append(ts, CleanupTable{Name: LedgerTable, Dead: func(now string) string { return "at <= " + now + " - " + age }, Order: "ORDER BY at"})
	}
	ts = append(ts, CleanupTable{Name: AlertStateTable, Dead: func(now string) string { return "period_end <= " + now }})
	if eventRetention > 0 {
		age := "interval '" + Interval(eventRetention) + "'"
		ts = append(ts, CleanupTable{Name: EventsTable, Dead: func(now string) string { return "delivered_at <= " + now + " - " + age }})
	}
	return ts
}

// CleanupNow is the time of a cleanup batch: $1, else the database's now().
const CleanupNow = "COALESCE($1::timestamptz, now())"

// DeleteWalk deletes up to $2 rows of table t (as SQL takes it) that are
// dead at $1 in its pages [$3, $4) that no check holds, and returns how
// many with the table's size in pages ($5: t as regclass input).
func DeleteWalk(t, dead string) string {
	return `WITH d AS (DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ctid >= format('(%s,0)', $3::bigint)::tid AND ctid < format('(%s,0)', $4::bigint)::tid
	AND ` + dead + ` LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1)
SELECT count(*), pg_relation_size($5::regclass) / current_setting('block_size')::bigint FROM d`
}

// DeleteOrdered deletes up to $2 of the oldest rows of t dead at $1 that no
// check holds.
func DeleteOrdered(t, dead, order string) string {
	return `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + dead + `
	` + order + ` LIMIT $2 FOR UPDATE SKIP LOCKED))`
}

// citusSums adds up run_command_on_shards's results, each "n size": the
// rows a shard deleted and its size in pages (0 when not walking).
const citusSums = `SELECT coalesce(sum(split_part(result, ' ', 1)::bigint) FILTER (WHERE success), 0),
       coalesce(max(split_part(result, ' ', 1)::bigint) FILTER (WHERE success), 0),
       coalesce(max(split_part(result, ' ', 2)::bigint) FILTER (WHERE success), 0),
       coalesce(string_agg(result, '; ') FILTER (WHERE NOT success), '')
FROM run_command_on_shards($1::regclass, format(`

// citusDead is a dead-row condition inside format's literal: its quotes
// doubled, the time as %L.
func citusDead(dead func(now string) string) string {
	return strings.ReplaceAll(dead("%L::timestamptz"), "'", "''")
}

// CitusDeleteWalk is DeleteWalk on every shard of the distributed table
// $1, run there by run_command_on_shards through the coordinator (Citus
// cannot lock rows by ctid across shards), its time ($2) the coordinator's;
// a walk scans the same range of pages ($3, $4) in every shard, up to the
// largest shard's size; $5 is the batch size.
func CitusDeleteWalk(dead func(now string) string) string {
	return citusSums + `
  'WITH d AS (DELETE FROM %%1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %%1$s WHERE ctid >= ''(%s,0)''::tid AND ctid < ''(%s,0)''::tid AND ` + citusDead(dead) + ` LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING 1)
   SELECT count(*) || '' '' || pg_relation_size(''%%1$s'') / current_setting(''block_size'')::bigint FROM d',
  $3::bigint, $4::bigint, COALESCE($2::timestamptz, now()), $5::int))`
}

// CitusDeleteOrdered is DeleteOrdered on every shard of $1 likewise, $2 the
// time and $3 the batch size.
func CitusDeleteOrdered(dead func(now string) string, order string) string {
	return citusSums + `
  'WITH d AS (DELETE FROM %%1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %%1$s WHERE ` + citusDead(dead) + ` ` + order + ` LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING 1)
   SELECT count(*) || '' 0'' FROM d',
  COALESCE($2::timestamptz, now()), $3::int))`
}

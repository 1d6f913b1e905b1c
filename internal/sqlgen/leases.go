package sqlgen

import (
	"hash/fnv"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The tables of concurrency leases (internal/lease), created by the
// migrations: one row per lease of a key, in a logged table or an UNLOGGED
// twin, and the sequence of their fencing tokens (logged for both, so that
// tokens never go back, not even after a crash empties the unlogged table).
const (
	LeasesTable          = "pgratelimit_leases"
	EphemeralLeasesTable = "pgratelimit_ephemeral_leases"
	LeaseTokensSequence  = "pgratelimit_lease_tokens"
)

// LeaseStatements are the statements of one leases table. A key's leases
// are decided under its lock row, a row of the bucket table of the same
// storage (the engine inserts and locks it as any bucket's), so no statement
// here locks anything: every writer of a key's leases holds that row first.
// Released leases are deleted; an expired one stays until cleanup deletes
// it (Release and Extend then tell it from one never acquired).
type LeaseStatements struct {
	// Read reads every lease of the keys (prefix, key), live or expired:
	// liveness is judged in Go, by the check's clock.
	Read Rows
	// Write inserts or replaces leases: (prefix, key, id, weight, token,
	// acquired_at, expires_at).
	Write Rows
	// Delete deletes leases: (prefix, key, id).
	Delete Rows
	// Touch moves the expires_at of the keys' lock rows to at least a
	// time: (prefix, key, expires_at). The row stays a placeholder (its
	// balance is not touched) that cleanup keeps while the key's leases
	// live; the write itself makes a transaction under REPEATABLE READ or
	// SERIALIZABLE that locks the row with an older snapshot fail with a
	// serialization error rather than count leases it cannot see.
	Touch Rows
	// List reads a key's leases ($1, $2) with the clock ($3, else the
	// database's): a row of NULL lease columns when it has none.
	List string
}

// Leases and EphemeralLeases are the statements of the two leases tables,
// each with the bucket table of its storage for the lock rows.
var (
	Leases          = leaseStatements(pgx.Identifier{LeasesTable}.Sanitize(), pgx.Identifier{DurableTable}.Sanitize())
	EphemeralLeases = leaseStatements(pgx.Identifier{EphemeralLeasesTable}.Sanitize(), pgx.Identifier{EphemeralTable}.Sanitize())
)

func leaseStatements(t, buckets string) LeaseStatements {
	const cols = `prefix, key, id, weight, token, acquired_at, expires_at`
	const upsert = `
ON CONFLICT (prefix, key, id) DO UPDATE SET weight = excluded.weight, token = excluded.token,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at`
	return LeaseStatements{
		Read: Rows{
			One: `SELECT ` + cols + ` FROM ` + t + ` WHERE prefix = $1 AND key = $2`,
			Many: `SELECT l.prefix, l.key, l.id, l.weight, l.token, l.acquired_at, l.expires_at
FROM unnest($1::text::text[], $2::text::text[]) AS r(prefix, key)
JOIN ` + t + ` l ON l.prefix = r.prefix AND l.key = r.key`,
		},
		Write: Rows{
			One: `INSERT INTO ` + t + ` (` + cols + `)
VALUES ($1, $2, $3, $4, $5, $6::text::timestamptz, $7::text::timestamptz)` + upsert,
			Many: `INSERT INTO ` + t + ` (` + cols + `)
SELECT ` + cols + `
FROM unnest($1::text::text[], $2::text::text[], $3::text::text[], $4::text::bigint[], $5::text::bigint[],
            $6::text::timestamptz[], $7::text::timestamptz[]) AS r(` + cols + `)` + upsert,
		},
		Delete: Rows{
			One: `DELETE FROM ` + t + ` WHERE prefix = $1 AND key = $2 AND id = $3`,
			Many: `DELETE FROM ` + t + ` l USING unnest($1::text::text[], $2::text::text[], $3::text::text[]) AS r(prefix, key, id)
WHERE l.prefix = r.prefix AND l.key = r.key AND l.id = r.id`,
		},
		Touch: Rows{
			One: `UPDATE ` + buckets + ` SET expires_at = greatest(expires_at, $3::text::timestamptz) WHERE prefix = $1 AND key = $2`,
			Many: `UPDATE ` + buckets + ` AS b SET expires_at = greatest(b.expires_at, r.expires_at)
FROM unnest($1::text::text[], $2::text::text[], $3::text::timestamptz[]) AS r(prefix, key, expires_at)
WHERE b.prefix = r.prefix AND b.key = r.key`,
		},
		List: `SELECT l.id, l.weight, l.token, l.acquired_at, l.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT 1) one LEFT JOIN ` + t + ` l ON l.prefix = $1 AND l.key = $2
ORDER BY l.acquired_at, l.id`,
	}
}

// LeaseTokens reads $1 new fencing tokens, in increasing order.
var LeaseTokens = `SELECT nextval(` + quoteLiteral(LeaseTokensSequence) + `::regclass) FROM generate_series(1, $1::bigint)`

// LeaseNotify sends the notification of a release: (channel, key), in the
// transaction, so that it is delivered only if the release commits.
var LeaseNotify = Rows{
	One:  `SELECT pg_notify($1, $2)`,
	Many: `SELECT pg_notify(c, k) FROM unnest($1::text::text[], $2::text::text[]) AS r(c, k)`,
}

// LeaseChannel is the LISTEN/NOTIFY channel of the releases of prefix's
// leases: a fixed name and a hash of the prefix (a channel name is at most
// 63 bytes), so that another prefix on the same channel only costs a waiter
// a needless try.
func LeaseChannel(prefix string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(prefix))
	return "pgratelimit_leases_" + strconv.FormatUint(h.Sum64(), 16)
}

// Listen is the statement that listens on channel c (LeaseChannel's, a
// plain identifier).
func Listen(c string) string { return `LISTEN ` + pgx.Identifier{c}.Sanitize() }

// quoteLiteral quotes s, one of our own names, as a string literal.
func quoteLiteral(s string) string { return `'` + s + `'` }

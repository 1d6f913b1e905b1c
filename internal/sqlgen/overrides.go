package sqlgen

import "github.com/jackc/pgx/v5"

// The tables of limits as data, created by migration 00010.
const (
	OverridesTable = "pgratelimit_overrides"
	PoliciesTable  = "pgratelimit_policies"
)

// OverrideStatements are the statements of per-key overrides beside a
// check's (which reads them with the bucket's row, see Table.Overrides),
// with scalar parameters and times as text, so that they run on pgx and
// database/sql alike, behind PgBouncer, and route to one shard on Citus.
type OverrideStatements struct {
	// Read reads the override of a key ($1, $2): capacity, refill, until
	// (no row: none). Peek's, and Citus's after each lock.
	Read string
	// Set writes the override of a key ($1, $2): capacity $3, refill $4,
	// until $5 ('' for none), note $6, at $7.
	Set string
	// Clear deletes the override of a key ($1, $2).
	Clear string
	// List reads up to $4 overrides (prefix, key, capacity, refill, until,
	// note, updated_at), in (prefix, key) order: of prefix $1 ('' for any),
	// of key $2 ('' for any), after key $3 ('' for the first).
	List string
}

// Overrides are the statements of per-key overrides.
var Overrides = func() OverrideStatements {
	t := pgx.Identifier{OverridesTable}.Sanitize()
	return OverrideStatements{
		Read: `SELECT capacity, refill, until FROM ` + t + ` WHERE prefix = $1 AND key = $2`,
		Set: `INSERT INTO ` + t + ` (prefix, key, capacity, refill, until, note, updated_at)
VALUES ($1, $2, $3, $4, NULLIF($5, '')::timestamptz, $6, $7::text::timestamptz)
ON CONFLICT (prefix, key) DO UPDATE SET capacity = excluded.capacity, refill = excluded.refill,
    until = excluded.until, note = excluded.note, updated_at = excluded.updated_at`,
		Clear: `DELETE FROM ` + t + ` WHERE prefix = $1 AND key = $2`,
		List: `SELECT prefix, key, capacity, refill, until, note, updated_at FROM ` + t + `
WHERE ($1 = '' OR prefix = $1) AND ($2 = '' OR key = $2) AND key > $3
ORDER BY prefix, key LIMIT $4`,
	}
}()

// PolicyStatements are the statements of the policies limiters record.
type PolicyStatements struct {
	// Record notes that a process runs a policy: prefix $1, storage $2,
	// capacity $3, refill $4, schedule $5, features $6; a policy seen
	// before only moves its last_seen.
	Record string
	// List reads every policy recorded (prefix, storage, capacity, refill,
	// schedule, features, first_seen, last_seen), by prefix, the most
	// recently seen first.
	List string
}

// Policies are the statements of recorded policies.
var Policies = func() PolicyStatements {
	t := pgx.Identifier{PoliciesTable}.Sanitize()
	return PolicyStatements{
		Record: `INSERT INTO ` + t + ` AS p (prefix, storage, capacity, refill, schedule, features)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (prefix, storage, capacity, refill, schedule, features) DO UPDATE SET last_seen = now()`,
		List: `SELECT prefix, storage, capacity, refill, schedule, features, first_seen, last_seen FROM ` + t + `
ORDER BY prefix, last_seen DESC, storage, capacity, refill, schedule, features`,
	}
}()

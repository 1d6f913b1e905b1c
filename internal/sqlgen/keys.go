package sqlgen

import "github.com/jackc/pgx/v5"

// KeyStatements are the reads of package admin over one bucket table: the
// stored rows of a prefix's keys, for an operator to find and look at.
type KeyStatements struct {
	// List reads up to $4 rows of prefix $1 whose key is in [$2, $5) and
	// after $3, in key order: key, tokens, refilled_at, expires_at,
	// capacity (0: none stored), the number of leases in the row (0:
	// none). A range of the primary key's index (its columns are COLLATE
	// "C": bytewise, the order of code points), in a generic plan too.
	List string
	// Count counts the rows of prefix $1: all of them, those whose check
	// left at most $2 tokens, and those it left at most 0, counting only
	// rows that are not placeholders (refilled_at the zero time) and not
	// full again by now (expires_at past).
	Count string
}

// DurableKeys and EphemeralKeys are the key reads of the two bucket tables.
var (
	DurableKeys   = keyStatements(pgx.Identifier{DurableTable}.Sanitize())
	EphemeralKeys = keyStatements(pgx.Identifier{EphemeralTable}.Sanitize())
)

func keyStatements(t string) KeyStatements {
	return KeyStatements{
		List: `SELECT key, tokens, refilled_at, expires_at, COALESCE(capacity, 0), COALESCE(json_array_length(leases), 0)
FROM ` + t + `
WHERE prefix = $1 AND key >= $2::text AND key < $5::text AND key > $3::text
ORDER BY key LIMIT $4`,
		Count: `SELECT count(*),
       count(*) FILTER (WHERE tokens <= $2 AND refilled_at > ` + placeholderTime + ` AND expires_at > clock_timestamp()),
       count(*) FILTER (WHERE tokens <= 0 AND refilled_at > ` + placeholderTime + ` AND expires_at > clock_timestamp())
FROM ` + t + `
WHERE prefix = $1`,
	}
}

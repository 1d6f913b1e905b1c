package pgratelimit

import "fmt"

// Dialect is the kind of database a Client's bucket tables live in.
type Dialect int

const (
	// DetectDialect asks the database: Citus when the bucket tables are
	// distributed tables of Citus (migrations.Distribute), else Postgres.
	DetectDialect Dialect = iota
	// Postgres is plain PostgreSQL (or Citus with local bucket tables).
	Postgres
	// Citus is a Citus cluster whose bucket tables are distributed by key.
	Citus
)

// String returns "detect", "postgres" or "citus".
func (d Dialect) String() string {
	switch d {
	case DetectDialect:
		return "detect"
	case Postgres:
		return "postgres"
	case Citus:
		return "citus"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

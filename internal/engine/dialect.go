package engine

import (
	"errors"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Dialect is what the engine says differently to plain PostgreSQL and to
// Citus: the statement shape of a transaction, how settings are set, and
// what a coalesced batch may hold. Postgres is plain PostgreSQL's;
// internal/citus has Citus's.
type Dialect interface {
	// Name is "postgres" or "citus".
	Name() string
	// Shape is the statement shape of a transaction over n rows: of our
	// own, or in the caller's (own false).
	Shape(n int, own bool) Shape
	// Set returns the statements that set the pairs (name, value, ...)
	// for the transaction.
	Set(pairs []string) []Stmt
	// OneRowBatches says that a coalesced batch holds the requests of one
	// row only.
	OneRowBatches() bool
}

// Postgres is plain PostgreSQL (or Citus with local bucket tables).
type Postgres struct{}

// Name is "postgres".
func (Postgres) Name() string { return "postgres" }

// PerRowMax is the most rows an own transaction sends as statements of one
// row each rather than one statement over arrays.
const PerRowMax = 4

// Shape: a few rows go one statement each, more as arrays. In the caller's
// transaction every statement takes one row: array statements would be
// planned under the caller's settings, and that plan cached for ours.
func (Postgres) Shape(n int, own bool) Shape {
	if own && n > PerRowMax {
		return arrays{}
	}
	return OneRow{}
}

// Set is one set_config(name, value, true) per pair, in one statement.
func (Postgres) Set(pairs []string) []Stmt {
	args := make([]any, len(pairs))
	for i, p := range pairs {
		args[i] = p
	}
	return []Stmt{{SQL: sqlgen.SetConfig(len(pairs) / 2), Args: args}}
}

// OneRowBatches: a batch holds any rows.
func (Postgres) OneRowBatches() bool { return false }

// ErrShardMoved fails a transaction routed to a Citus node that no longer
// holds one of its shards: it rolled back having decided nothing.
var ErrShardMoved = errors.New("pgratelimit: a shard moved off the node the check was sent to")

// Rows are a's rows, distinct, in lock order.
func (a *Attempt) Rows() []Row { return a.rows }

// addGrant adds a grant read of r's to a's account of r, if a holds r (a
// dialect that reads grants in statements of their own).
func (a *Attempt) addGrant(r Row, g account.Grant) {
	if st := a.state[r]; st != nil {
		st.Grants = append(st.Grants, g)
	}
}

// clockStmt is the statement that reads the database's clock into a, for
// shapes whose locking statements do not.
func (a *Attempt) clockStmt() Stmt {
	return Stmt{SQL: sqlgen.Clock, Scan: func(rs RowScanner) error {
		for rs.Next() {
			var t time.Time
			if err := rs.Scan(&t); err != nil {
				return err
			}
			if t.After(a.now) {
				a.now = t
			}
		}
		return rs.Err()
	}}
}

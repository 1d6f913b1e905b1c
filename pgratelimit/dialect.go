package pgratelimit

import (
	"context"
	"fmt"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgx/v5"
)

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

// dialect is what the engine says differently to plain PostgreSQL and to
// Citus: the statement shape of an own transaction, how settings are set,
// what a coalesced batch may hold, and how cleanup deletes.
type dialect interface {
	kind() Dialect
	// shape is the statement shape of a transaction over n rows: of our
	// own, or in the caller's (own false).
	shape(n int, own bool) shape
	// set returns the statements that set the pairs (name, value, ...)
	// for the transaction.
	set(pairs []string) []stmt
	// oneRowBatches says that a coalesced batch holds the checks of one
	// row only.
	oneRowBatches() bool
	// deleter deletes a batch of t's dead rows.
	deleter(t cleanupTable) deleter
}

func dialectOf(d Dialect) dialect {
	if d == Citus {
		return citus{}
	}
	return postgres{}
}

// postgres is plain PostgreSQL.
type postgres struct{}

func (postgres) kind() Dialect { return Postgres }

// shape: a few rows go one statement each, more as arrays. In the caller's
// transaction every statement takes one row: array statements would be
// planned under the caller's settings, and that plan cached for ours.
func (postgres) shape(n int, own bool) shape {
	if own && n > perRowMax {
		return arrays{}
	}
	return oneRow{}
}

// set: one set_config(name, value, true) per pair, in one statement.
func (postgres) set(pairs []string) []stmt {
	args := make([]any, len(pairs))
	for i, p := range pairs {
		args[i] = p
	}
	return []stmt{{sql: sqlgen.SetConfig(len(pairs) / 2), args: args}}
}

func (postgres) oneRowBatches() bool { return false }

// deleter: the oldest dead rows that no check holds, or, walking t, the
// dead rows of a range of its pages that no check holds.
func (postgres) deleter(ct cleanupTable) deleter {
	t := ct.sql
	if t == "" {
		t = pgx.Identifier{ct.name}.Sanitize()
	}
	dead := ct.dead("COALESCE($1::timestamptz, now())")
	if ct.order == "" {
		del := `WITH d AS (DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ctid >= format('(%s,0)', $3::bigint)::tid AND ctid < format('(%s,0)', $4::bigint)::tid
	AND ` + dead + ` LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING 1)
SELECT count(*), pg_relation_size($5::regclass) / current_setting('block_size')::bigint FROM d`
		return walk(func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (n int64, full bool, size int64, err error) {
			err = tx.QueryRow(ctx, del, now, batchSize, from, to, t).Scan(&n, &size)
			return n, n >= int64(batchSize), size, err
		})
	}
	del := `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + dead + `
	` + ct.order + ` LIMIT $2 FOR UPDATE SKIP LOCKED))`
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		tag, err := tx.Exec(ctx, del, now, batchSize)
		n := tag.RowsAffected()
		return n, n >= int64(batchSize), err
	}
}

// querier is what detection needs of a pool, a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// detectDialect asks the database whether the bucket tables are distributed
// tables of Citus. Tables that do not exist yet count as plain.
func detectDialect(ctx context.Context, q querier) (dialect, error) {
	const why = "detect the database's dialect (plain PostgreSQL or Citus; ClientConfig.Dialect names it instead)"
	var citusHere, dist bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citusHere); err != nil {
		return nil, dbError(why, err)
	}
	if citusHere {
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN (to_regclass($1), to_regclass($2)))`, DurableTable, EphemeralTable).Scan(&dist)
		if err != nil {
			return nil, dbError(why, err)
		}
	}
	if dist {
		return citus{}, nil
	}
	return postgres{}, nil
}

// Package citus is what pgratelimit knows of a Citus cluster whose tables
// are distributed by key (migrations.Distribute): whether the database is
// one (Detect), the shard map and Citus's hash of keys, the router that
// sends a check to the node holding its shards (to run there in the
// engine's OnShards dialect, on the shards' own tables), and where cleanup
// deletes each shard's rows. The statements a check sends, through the
// coordinator (engine.Citus) or on a node, are the engine's. It knows nothing of coalescing:
// the client gives each node's checks to a coalescer of its own.
package citus

import (
	"context"
	"errors"

	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Detect asks the database, through ex (a pool's executor, or a caller's
// transaction), whether the bucket tables are distributed tables of Citus:
// engine.Citus if so, else engine.Postgres (tables that do not exist yet
// count as plain).
func Detect(ctx context.Context, ex engine.Executor) (engine.Dialect, error) {
	const why = "detect the database's dialect (plain PostgreSQL or Citus)"
	var citusHere, dist bool
	if err := ex.Pipeline(ctx, []engine.Stmt{scanBool(`SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`, &citusHere)}); err != nil {
		return nil, engine.DBError(why, err)
	}
	if citusHere { // else the catalog this reads does not exist
		st := scanBool(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN (to_regclass($1), to_regclass($2)))`, &dist, sqlgen.DurableTable, sqlgen.EphemeralTable)
		if err := ex.Pipeline(ctx, []engine.Stmt{st}); err != nil {
			return nil, engine.DBError(why, err)
		}
	}
	if dist {
		return engine.Citus{}, nil
	}
	return engine.Postgres{}, nil
}

// scanBool is the statement sql with args, reading the boolean of its one
// row into dst.
func scanBool(sql string, dst *bool, args ...any) engine.Stmt {
	return engine.Stmt{SQL: sql, Args: args, Scan: func(rs engine.RowScanner) error {
		if !rs.Next() {
			if err := rs.Err(); err != nil {
				return err
			}
			return errors.New("no row")
		}
		if err := rs.Scan(dst); err != nil {
			return err
		}
		for rs.Next() {
		}
		return rs.Err()
	}}
}

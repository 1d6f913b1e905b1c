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

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// querier is what detection needs of a pool, a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Detect asks the database whether the bucket tables are distributed tables
// of Citus: engine.Citus if so, else engine.Postgres (tables that do not exist
// yet count as plain).
func Detect(ctx context.Context, q querier) (engine.Dialect, error) {
	const why = "detect the database's dialect (plain PostgreSQL or Citus)"
	var citusHere, dist bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citusHere); err != nil {
		return nil, engine.DBError(why, err)
	}
	if citusHere {
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN (to_regclass($1), to_regclass($2)))`, sqlgen.DurableTable, sqlgen.EphemeralTable).Scan(&dist)
		if err != nil {
			return nil, engine.DBError(why, err)
		}
	}
	if dist {
		return engine.Citus{}, nil
	}
	return engine.Postgres{}, nil
}

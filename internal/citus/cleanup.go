package citus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Cleanup on Citus deletes each shard's dead rows on the node that holds the
// shard, in the shard's own table, with plain PostgreSQL's batches, through
// one connection per node made from the pool's settings (host and port
// replaced, as routed checks do; see Router). Through the coordinator the
// same batch runs on every shard by run_command_on_shards, which connects to
// the workers afresh for every call: a second or more per batch, and a burst
// of connections on every worker. A table goes through the coordinator still
// when a shard of it is not on one reachable node alone (a node without
// synced metadata, a shard with several placements, a worker the
// application cannot connect to).
//
// Without a Clock, a shard's rows expire by its node's clock, the one a
// check routed there reads. Each batch holds its shard where it is, as a
// routed check does (Part.Guard); one that finds its shard moved away since
// the map was read ends that shard's part, for the next run. A row deleted
// while a move copies the shard is deleted in the new copy too (a move by
// logical replication replicates the delete) or stays there, dead, for the
// next run: cleanup deletes only rows that no check tells from missing ones,
// so a delete that misses the new copy changes no decision.

// Where says where a table's cleanup runs on Citus.
type Where int8

const (
	// Local: the table is not distributed; clean it as on plain PostgreSQL.
	Local Where = iota
	// Coordinator: through the coordinator, on every shard at once.
	ViaCoordinator
	// Shards: shard by shard, on each shard's node (Parts).
	Shards
)

// Part is one shard of a table, on the node that holds it.
type Part struct {
	// Pool reaches the node (one connection).
	Pool *pgxpool.Pool
	// Table is the shard's table, as SQL takes it.
	Table string
	// Desc names the part in errors: the table, the shard and the node.
	Desc  string
	shard shardRange
}

// Guard holds p's shard on its node for the rest of tx, as a routed check
// does: the shard's metadata lock (a move waits for it to switch the shard
// over), then whether the node still holds the shard; engine.ErrShardMoved
// if not. So a batch never touches the old copy of a moved shard, whose
// deferred drop (at the next move at the latest) would fail on the batch's
// lock, failing that move.
func (p Part) Guard(ctx context.Context, tx pgx.Tx) error {
	var here bool
	b := &pgx.Batch{}
	b.Queue(sqlgen.LockShards, sqlgen.Int64Array(1, func(int) int64 { return p.shard.id }))
	b.Queue(`SELECT ` + sqlgen.Placed(p.shard.id, p.shard.group) + ` = 1`).QueryRow(func(r pgx.Row) error {
		return r.Scan(&here)
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if !here {
		return engine.ErrShardMoved
	}
	return nil
}

// Gone says whether err ended a shard's part because the shard is not on
// its node any more (moved since the map was read): its rows are the next
// run's.
func Gone(err error) bool { return moved(err) }

// CleanupParts says where table's cleanup runs: Local for a table Citus
// does not distribute, Coordinator when a shard is not on one reachable node
// alone (or the role does not own the table: Citus lets only owners take
// shard locks), else Shards, with the shards' parts on nodes of pools.
func CleanupParts(ctx context.Context, pool *pgxpool.Pool, table string, pools *Pools) (Where, []Part, error) {
	name := pgx.Identifier{table}.Sanitize()
	var distributed, owner bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = pg_catalog.to_regclass($1)),
       coalesce((SELECT pg_catalog.pg_has_role(relowner, 'USAGE') FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass($1)), false)`, name).Scan(&distributed, &owner); err != nil {
		return 0, nil, err
	}
	switch {
	case !distributed:
		return Local, nil, nil
	case !owner:
		return ViaCoordinator, nil, nil
	}
	m, err := loadShards(ctx, pool, table, name)
	if err != nil {
		return 0, nil, err
	}
	parts := make([]Part, 0, len(m.shards))
	for _, sh := range m.shards {
		if sh.node == "" || !sh.single {
			return ViaCoordinator, nil, nil
		}
		p, err := pools.Get(ctx, sh.node)
		if err != nil {
			return ViaCoordinator, nil, nil
		}
		parts = append(parts, Part{Pool: p, Table: sh.name, Desc: fmt.Sprintf("%s (shard %d on %s)", table, sh.id, sh.node), shard: sh})
	}
	return Shards, parts, nil
}

// Pools are pools to Citus nodes by "host:port", made from the application's
// pool's settings (host and port replaced): the one cache of them, for
// routing (a pool per node the checks go to) and for cleanup (a pool of one
// connection per node a run cleans on). Not safe for concurrent use: its
// owner locks.
type Pools struct {
	app *pgxpool.Pool
	// self is the node the application's pool is on: its pool is the
	// application's.
	self string
	// One makes pools of one connection, each given ConnectTimeout to
	// connect, checked by a ping (cleanup).
	One            bool
	ConnectTimeout time.Duration
	m              map[string]*pgxpool.Pool
}

// NewPools returns the pools to app's cluster's nodes.
func NewPools(app *pgxpool.Pool) *Pools { return &Pools{app: app} }

// Get returns the pool of the node at addr, making it the first time.
func (ps *Pools) Get(ctx context.Context, addr string) (*pgxpool.Pool, error) {
	if addr == ps.self {
		return ps.app, nil
	}
	if p, ok := ps.m[addr]; ok {
		if p == nil {
			return nil, errUnreachable
		}
		return p, nil
	}
	if ps.m == nil {
		ps.m = make(map[string]*pgxpool.Pool)
	}
	ps.m[addr] = nil // until it is made: a node that cannot be reached is tried once
	cfg, err := nodePoolConfig(ps.app.Config(), addr)
	if err != nil {
		return nil, err
	}
	if ps.One {
		cfg.MinConns, cfg.MinIdleConns, cfg.MaxConns = 0, 0, 1
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if ps.One {
		pctx, cancel := context.WithTimeout(ctx, ps.ConnectTimeout)
		err = p.Ping(pctx)
		cancel()
		if err != nil {
			p.Close()
			return nil, err
		}
	}
	ps.m[addr] = p
	return p, nil
}

var errUnreachable = errors.New("pgratelimit: a Citus node could not be reached")

// Close closes the pools ps made (not the application's).
func (ps *Pools) Close() {
	for _, p := range ps.m {
		if p != nil {
			p.Close()
		}
	}
}

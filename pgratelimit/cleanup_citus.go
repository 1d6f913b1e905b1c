package pgratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Cleanup on Citus deletes each shard's dead rows on the node that holds the
// shard, in the shard's own table, with plain PostgreSQL's batches (walked
// or index-ordered, see cleanupTable), through one connection per node made
// from the pool's settings (host and port replaced, as routed checks do; see
// router). Through the coordinator the same batch runs on every shard by
// run_command_on_shards, which connects to the workers afresh for every
// call: a second or more per batch, and a burst of connections on every
// worker. A table goes through the coordinator still when a shard of it is
// not on one reachable node alone (a node without synced metadata, a shard
// with several placements, a worker the application cannot connect to).
//
// Without a Clock, a shard's rows expire by its node's clock, the one a
// check routed there reads. Each batch holds its shard where it is, as a
// routed check does (see shardGuard); one that finds its shard moved away
// since the map was read ends that shard's part, for the next run. A row
// deleted while a move copies the shard is deleted in the new copy too (a
// move by logical replication replicates the delete) or stays there, dead,
// for the next run: cleanup deletes only rows that no check tells from
// missing ones, so a delete that misses the new copy changes no decision.

// cleanupPart is where a table's batches run: all of it through the pool,
// or one shard on its node.
type cleanupPart struct {
	db    beginner
	del   deleter
	table string // for errors: the table, and the shard and node
	shard bool
}

// beginner is a pool or a connection.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// cleanupParts returns where ct's batches run: through pool, or, on Citus
// when every shard can be, on each shard's node (pools made in nodes, each
// given connectTimeout to connect). A table that Citus does not distribute
// is cleaned on the coordinator as on plain PostgreSQL.
func cleanupParts(ctx context.Context, pool *pgxpool.Pool, d dialect, ct cleanupTable, nodes nodePools, connectTimeout time.Duration) ([]cleanupPart, error) {
	whole := []cleanupPart{{db: pool, del: d.deleter(ct), table: ct.name}}
	if d.kind() != Citus {
		return whole, nil
	}
	name := pgx.Identifier{ct.name}.Sanitize()
	var distributed, owner bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = pg_catalog.to_regclass($1)),
       coalesce((SELECT pg_catalog.pg_has_role(relowner, 'USAGE') FROM pg_catalog.pg_class WHERE oid = pg_catalog.to_regclass($1)), false)`, name).Scan(&distributed, &owner); err != nil {
		return nil, err
	}
	switch {
	case !distributed: // left on the coordinator
		return []cleanupPart{{db: pool, del: postgres{}.deleter(ct), table: ct.name}}, nil
	case !owner: // Citus lets only owners take shard locks (see shardGuard)
		return whole, nil
	}
	m, err := loadShards(ctx, pool, ct.name, name)
	if err != nil {
		return nil, err
	}
	parts := make([]cleanupPart, 0, len(m.shards))
	for _, sh := range m.shards {
		if sh.node == "" || !sh.single {
			return whole, nil
		}
		db := nodes.get(ctx, pool, sh.node, connectTimeout)
		if db == nil {
			return whole, nil
		}
		shard := ct
		shard.sql = sh.name
		parts = append(parts, cleanupPart{db: db, del: shardGuard(sh, postgres{}.deleter(shard)), table: fmt.Sprintf("%s (shard %d on %s)", ct.name, sh.id, sh.node), shard: true})
	}
	return parts, nil
}

// shardGuard runs del in a transaction on sh's node only while the node
// holds sh: it takes the shard's metadata lock first (ShareLock, as a routed
// check does: a move waits for it to switch the shard over), then reads
// whether the node still holds the shard, and fails with errShardMoved if
// not. So a batch never touches the old copy of a moved shard, whose
// deferred drop (at the next move at the latest) would fail on the batch's
// lock, failing that move.
func shardGuard(sh shardRange, del deleter) deleter {
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		var here bool
		b := &pgx.Batch{}
		b.Queue(`SELECT pg_catalog.lock_shard_metadata(5, $1::bigint[])`, []int64{sh.id})
		b.Queue(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement WHERE shardid = $1 AND groupid = $2)`, sh.id, sh.group).QueryRow(func(r pgx.Row) error {
			return r.Scan(&here)
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return 0, false, err
		}
		if !here {
			return 0, false, errShardMoved
		}
		return del(ctx, tx, now, batchSize)
	}
}

// gone says whether err ended a shard's part because the shard is not on
// the node any more (moved since the map was read).
func (p cleanupPart) gone(err error) bool {
	return p.shard && moved(err)
}

// nodePools are the pools one cleanup run opened to Citus nodes, by
// "host:port"; nil for a node it could not reach.
type nodePools map[string]*pgxpool.Pool

// get returns a pool of one connection to the node at addr, made from app's
// settings the first time, or nil if the node cannot be reached within
// timeout.
func (ns nodePools) get(ctx context.Context, app *pgxpool.Pool, addr string, timeout time.Duration) *pgxpool.Pool {
	if p, ok := ns[addr]; ok {
		return p
	}
	ns[addr] = nil
	cfg, err := nodePoolConfig(app.Config(), addr)
	if err != nil {
		return nil
	}
	cfg.MinConns, cfg.MinIdleConns, cfg.MaxConns = 0, 0, 1
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil
	}
	ns[addr] = p
	return p
}

func (ns nodePools) close() {
	for _, p := range ns {
		if p != nil {
			p.Close()
		}
	}
}

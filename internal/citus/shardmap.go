package citus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// errNotHashDistributed is wrapped by loadShardMap's error when the table is
// not a Citus table hash-distributed by its key column (a plain table, a
// reference table, or distributed by something else): checks on it cannot be
// routed by key.
var errNotHashDistributed = errors.New("pgratelimit: not hash-distributed by key")

// shardMap says which Citus shard holds a key of one distributed table and
// which node holds that shard, so a check can be sent straight to that node.
//
// Citus hash-distributes a table by hashing the distribution column with its
// type's hash function (hashtext for text with the "C" collation, see
// hashText) and giving each shard an inclusive range of int4 hash values
// (pg_dist_shard.shardminvalue..shardmaxvalue, stored as text). Each shard has
// a placement (pg_dist_placement) on a node group, and each group a primary
// node (pg_dist_node). Since Citus 11 the metadata is synced to the workers,
// so a statement on the distributed table's own name, sent to a node that
// holds the key's shard, runs there locally: the coordinator is not involved.
//
// A map is a snapshot: the rebalancer may move a shard after it was loaded.
// Sent to the wrong node a statement is still correct (Citus forwards it); it
// only costs a hop. A shardMap is immutable and safe for concurrent use.
type shardMap struct {
	table  string
	shards []shardRange // sorted by hash range, disjoint
}

// shardRange is one shard: the hashes it holds and where.
type shardRange struct {
	min, max int32 // inclusive
	id       int64
	node     string // "host:port"; "" when no placement is on a usable node
	group    int32  // node's group (pg_dist_node.groupid)
	// name is the shard's own table on its node, as SQL takes it
	// (shard_name); single says the shard has one placement only, so that
	// statements on name there change the shard's only copy.
	name   string
	single bool
}

// shardMapProbes are keys whose shard loadShardMap asks Citus for, to check
// that hashText hashes as the cluster does (it would not on a big-endian
// server, or with a nondeterministic collation on the key column).
func shardMapProbes() []string {
	return []string{"", "a", "key-123", "ip:203.0.113.7", "user:héllo ✓", "hdr:0123456789abcdef0123456789abcdef"}
}

// loadShardMap reads the shard map of the distributed table named table
// (unqualified, found on the connection's search_path, as the package's
// statements find it) from Citus's metadata on q's database, a coordinator
// (or a worker with synced metadata).
//
// Only placements on active primary nodes whose metadata is synced
// (pg_dist_node.hasmetadata and metadatasynced) count, since only there does
// a statement on the table's name run locally; with several such placements
// (citus.shard_replication_factor > 1) the node of the lowest group is used.
// The error wraps errNotHashDistributed when the table is not hash-distributed
// by its key column.
func loadShardMap(ctx context.Context, q querierRows, table string) (*shardMap, error) {
	name := pgx.Identifier{table}.Sanitize()
	fail := func(err error) (*shardMap, error) {
		return nil, fmt.Errorf("pgratelimit: loading the Citus shard map of %s: %w", table, err)
	}
	if err := checkHashDistributed(ctx, q, name); err != nil {
		return fail(err)
	}
	m, err := loadShards(ctx, q, table, name)
	if err != nil {
		return fail(err)
	}
	if err := m.probe(ctx, q, name); err != nil {
		return fail(err)
	}
	return m, nil
}

// checkHashDistributed says why the table name is not hash-distributed by
// key, if it is not.
func checkHashDistributed(ctx context.Context, q querierRows, name string) error {
	// The table and how it is distributed (pg_dist_partition: 'h' is hash;
	// 'n' reference, single-shard and Citus local tables; 'a' and 'r' the
	// old append and range distribution).
	var exists bool
	var method, column string
	rows, err := q.Query(ctx, `SELECT c.oid IS NOT NULL, coalesce(p.partmethod::text, ''),
       coalesce(CASE WHEN p.partkey IS NOT NULL THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END, '')
  FROM (SELECT pg_catalog.to_regclass($1) AS oid) c
  LEFT JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = c.oid`, name)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&exists, &method, &column}, func() error { return nil })
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable:
		return fmt.Errorf("%w: no Citus metadata here (%s)", errNotHashDistributed, pgErr.Message)
	case err != nil:
		return err
	case !exists:
		return fmt.Errorf("table %s not found: %w", name, engine.ErrNotMigrated)
	case method == "":
		return fmt.Errorf("%w: not a Citus distributed table (run migrations.Distribute on the coordinator)", errNotHashDistributed)
	case method != "h" || column != "key":
		return fmt.Errorf("%w: partition method %q, distribution column %q", errNotHashDistributed, method, column)
	}
	return nil
}

// loadShards reads every shard of table (SQL name) with the node of its
// first usable placement, if any.
func loadShards(ctx context.Context, q querierRows, table, name string) (*shardMap, error) {
	// Every shard, with the node of its first usable placement (if any), in
	// one statement, so from one snapshot of the metadata. (A move keeps the
	// placement row and changes its groupid; the old copy waits in
	// pg_dist_cleanup for a deferred drop and is no longer a placement.)
	m := &shardMap{table: table}
	var r shardRange
	var host *string
	var port *int32
	rows, err := q.Query(ctx, `SELECT s.shardid, s.shardminvalue::int4, s.shardmaxvalue::int4, n.nodename, n.nodeport, coalesce(n.groupid, -1),
       pg_catalog.shard_name(s.logicalrelid, s.shardid),
       (SELECT count(*) = 1 FROM pg_catalog.pg_dist_placement pl WHERE pl.shardid = s.shardid)
  FROM pg_catalog.pg_dist_shard s
  LEFT JOIN LATERAL (
       SELECT n.nodename, n.nodeport, n.groupid
         FROM pg_catalog.pg_dist_placement pl
         JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
        WHERE pl.shardid = s.shardid AND pl.shardstate = 1
          AND n.isactive AND n.noderole = 'primary' AND n.hasmetadata AND n.metadatasynced
        ORDER BY n.groupid
        LIMIT 1) n ON true
 WHERE s.logicalrelid = pg_catalog.to_regclass($1)
 ORDER BY 2`, name)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&r.id, &r.min, &r.max, &host, &port, &r.group, &r.name, &r.single}, func() error {
			r.node = ""
			if host != nil && port != nil {
				r.node = net.JoinHostPort(*host, strconv.Itoa(int(*port)))
			}
			if n := len(m.shards); r.min > r.max || n > 0 && r.min <= m.shards[n-1].max {
				return fmt.Errorf("shard %d's hash range %d..%d is empty or overlaps another", r.id, r.min, r.max)
			}
			m.shards = append(m.shards, r)
			return nil
		})
	}
	if err == nil && len(m.shards) == 0 {
		err = errors.New("no shards")
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// probe checks that Citus puts a few keys where hashText says.
func (m *shardMap) probe(ctx context.Context, q querierRows, name string) error {
	var key string
	var want int64
	rows, err := q.Query(ctx, `SELECT k, pg_catalog.get_shard_id_for_distribution_column(pg_catalog.to_regclass($1), k)
  FROM unnest($2::text[]) k`, name, shardMapProbes())
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&key, &want}, func() error {
			if got, _, _ := m.shardOf(key); got != want {
				return fmt.Errorf("key %q is in shard %d, not %d as hashText says: the key column's hash is not PostgreSQL's hashtext on a little-endian server", key, want, got)
			}
			return nil
		})
	}
	return err
}

// querierRows is what loading a shard map needs of a pool, a connection or a
// transaction.
type querierRows interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// shardAt returns the shard whose range covers key's hash (the zero
// shardRange if none does).
func (m *shardMap) shardAt(key string) shardRange {
	h := hashText(key)
	i := sort.Search(len(m.shards), func(i int) bool { return m.shards[i].max >= h })
	if i == len(m.shards) || m.shards[i].min > h {
		return shardRange{}
	}
	return m.shards[i]
}

// shardOf returns the shard that holds key (0 if no shard's range covers its
// hash) and the "host:port" of a node with synced metadata that holds a
// placement of it; ok is false when there is no such node.
func (m *shardMap) shardOf(key string) (shardID int64, node string, ok bool) {
	s := m.shardAt(key)
	return s.id, s.node, s.node != ""
}

// nodes returns the distinct nodes ("host:port", sorted) that shardOf
// routes to.
func (m *shardMap) nodes() []string {
	var ns []string
	for _, s := range m.shards {
		if s.node != "" {
			ns = append(ns, s.node)
		}
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}

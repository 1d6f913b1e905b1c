package citus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// citusEnvVar points TestShardMapCitus at a Citus coordinator's database.
const citusEnvVar = "PGRATELIMIT_TEST_CITUS_URL"

// shardOf finds the range that holds a key's hash, at the ranges' edges too,
// and nothing in a gap or in a shard without a usable node.
func TestShardMapLookup(t *testing.T) {
	t.Parallel()
	m := &shardMap{shards: []shardRange{
		{min: math.MinInt32, max: -1000, id: 1, node: "w1:5432"},
		{min: -999, max: -999, id: 2, node: "[::1]:5432"},
		// gap -998..-1
		{min: 0, max: 1 << 20, id: 3},
		{min: 1<<20 + 1, max: math.MaxInt32, id: 4, node: "w1:5432"},
	}}
	rng := mrand.New(mrand.NewPCG(1, 2))
	for _, k := range hashTestKeys(rng, 5000) {
		h := hashText(k)
		var want shardRange
		for _, s := range m.shards {
			if s.min <= h && h <= s.max {
				want = s
			}
		}
		id, node, ok := m.shardOf(k)
		if id != want.id || node != want.node || ok != (want.node != "") {
			t.Fatalf("shardOf(%q) (hash %d) = %d, %q, %v; want shard %+v", k, h, id, node, ok, want)
		}
	}
	if got, want := m.nodes(), []string{"[::1]:5432", "w1:5432"}; !slices.Equal(got, want) {
		t.Errorf("nodes() = %q, want %q", got, want)
	}
}

// On plain PostgreSQL there is no map to load, and the error says why.
func TestShardMapWithoutCitus(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS shardmap_plain (key text)`); err != nil {
		t.Fatal(err)
	}
	_, err := loadShardMap(context.Background(), pool, "shardmap_plain")
	if !errors.Is(err, errNotHashDistributed) {
		t.Fatalf("loadShardMap on plain PostgreSQL: %v, want errNotHashDistributed", err)
	}
}

// On a Citus cluster the map puts 5,000 keys in the shard
// get_shard_id_for_distribution_column names and on the node of its
// placement, also when loaded on a worker and after a shard moved; tables not
// hash-distributed by key are refused.
func TestShardMapCitus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := citusSchema(t)
	// colocate_with 'none' and a shard count of their own: no other test's
	// tables join their group (Citus puts a table of default colocation in
	// the first matching group, and creating one locks the group against
	// the shard move below), and no other test's shard moves move these.
	for _, stmt := range []string{
		`CREATE TABLE t (prefix text COLLATE "C", key text COLLATE "C", PRIMARY KEY (prefix, key))`,
		`SELECT create_distributed_table('t', 'key', colocate_with => 'none', shard_count => 7)`,
		`CREATE TABLE by_prefix (prefix text, key text, PRIMARY KEY (prefix, key))`,
		`SELECT create_distributed_table('by_prefix', 'prefix', colocate_with => 'none')`,
		`CREATE TABLE ref (key text PRIMARY KEY)`,
		`SELECT create_reference_table('ref')`,
		`CREATE TABLE local (key text PRIMARY KEY)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	keys := hashTestKeys(mrand.New(mrand.NewPCG(5, 0)), 5000)
	m := checkShardMap(t, pool, keys)

	// A worker has the same metadata (Citus 11+ syncs it), so the same map.
	for _, node := range m.nodes() {
		host, port, _ := net.SplitHostPort(node)
		p, _ := strconv.ParseUint(port, 10, 16)
		cfg := pool.Config().Copy()
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		w, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wm, err := loadShardMap(ctx, w, "t")
		w.Close()
		if err != nil {
			t.Fatalf("loading the map on %s: %v", node, err)
		}
		if !slices.Equal(wm.shards, m.shards) {
			t.Errorf("the map loaded on %s differs from the coordinator's", node)
		}
	}

	for _, table := range []string{"by_prefix", "ref", "local"} {
		if _, err := loadShardMap(ctx, pool, table); !errors.Is(err, errNotHashDistributed) {
			t.Errorf("loadShardMap(%s): %v, want errNotHashDistributed", table, err)
		}
	}
	if _, err := loadShardMap(ctx, pool, "missing"); !errors.Is(err, engine.ErrNotMigrated) {
		t.Errorf("loadShardMap(missing): %v, want engine.ErrNotMigrated", err)
	}

	// Moved to another node (as the rebalancer does), a shard is found there
	// by a map loaded afterwards.
	if nodes := m.nodes(); len(nodes) > 1 {
		id, from, _ := m.shardOf(keys[0])
		to := nodes[0]
		if to == from {
			to = nodes[1]
		}
		fromHost, fromPort, _ := net.SplitHostPort(from)
		toHost, toPort, _ := net.SplitHostPort(to)
		if _, err := pool.Exec(ctx, `SELECT citus_move_shard_placement($1, $2, $3::int, $4, $5::int, shard_transfer_mode => 'block_writes')`,
			id, fromHost, fromPort, toHost, toPort); err != nil {
			t.Fatalf("moving shard %d from %s to %s: %v", id, from, to, err)
		}
		if _, node, _ := checkShardMap(t, pool, keys).shardOf(keys[0]); node != to {
			t.Errorf("shard %d moved to %s, the new map says %s", id, to, node)
		}
	}
}

// checkShardMap loads the map of table t and checks that it puts keys in the
// shard get_shard_id_for_distribution_column names, on the node of its
// placement (the lowest group's, if several).
func checkShardMap(t *testing.T, pool *pgxpool.Pool, keys []string) *shardMap {
	t.Helper()
	ctx := context.Background()
	m, err := loadShardMap(ctx, pool, "t")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT s.id, p.hosts, p.ports
  FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i),
       LATERAL (SELECT get_shard_id_for_distribution_column('t', u.k) AS id) s,
       LATERAL (SELECT array_agg(n.nodename ORDER BY n.groupid) AS hosts, array_agg(n.nodeport ORDER BY n.groupid) AS ports
                  FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                 WHERE pl.shardid = s.id AND n.noderole = 'primary') p
 ORDER BY u.i`, keys)
	if err != nil {
		t.Fatal(err)
	}
	var (
		i, mismatches int
		want          int64
		hosts         []string
		ports         []int32
		placed        []string
	)
	_, err = pgx.ForEachRow(rows, []any{&want, &hosts, &ports}, func() error {
		if len(hosts) == 0 {
			return fmt.Errorf("shard %d has no placement", want)
		}
		wantNode := net.JoinHostPort(hosts[0], strconv.Itoa(int(ports[0])))
		placed = append(placed, wantNode)
		if id, node, ok := m.shardOf(keys[i]); id != want || node != wantNode || !ok {
			if mismatches++; mismatches <= 10 {
				t.Errorf("shardOf(%q) = %d, %q, %v; Citus: shard %d on %q", keys[i], id, node, ok, want, wantNode)
			}
		}
		i++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if i != len(keys) || mismatches > 0 {
		t.Fatalf("compared %d of %d keys: %d differ", i, len(keys), mismatches)
	}
	slices.Sort(placed)
	if got, want := m.nodes(), slices.Compact(placed); !slices.Equal(got, want) {
		t.Errorf("nodes() = %q, the keys' placements are on %q", got, want)
	}
	t.Logf("%d shards on %q; %d keys agree with get_shard_id_for_distribution_column", len(m.shards), m.nodes(), len(keys))
	return m
}

// citusSchema returns a pool on a scratch schema of the Citus coordinator
// named by citusEnvVar (dropped when the test ends), or skips the test.
func citusSchema(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv(citusEnvVar)
	if url == "" {
		t.Skip("no Citus here: set " + citusEnvVar + " to a coordinator's database URL")
	}
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := pgx.Identifier{"citusmap_" + hex.EncodeToString(b[:])}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting to %s: %v", citusEnvVar, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema[0], err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema[0], err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema[0]
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

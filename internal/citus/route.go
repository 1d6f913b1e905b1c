package citus

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Routing on Citus: a statement on a distributed table sent to the
// coordinator is planned there, sent to the worker that holds its shard in a
// remote transaction, and planned again there: per check the cluster does
// several times the work of one plain PostgreSQL. So a Client on Citus sends
// each check whose buckets' shards all sit on one node straight to that node,
// through a pool of its own made from the application's pool's settings
// (host and port replaced), and runs it there on the shards' own tables: to
// that node's PostgreSQL they are plain tables, so the statements are the
// plain ones, planned once per connection. The checks of each node are
// coalesced in batches of their own; a transaction over several shards of
// one node is local to it.
//
// (Statements on the distributed table's name sent to the node that holds
// the shard would run there locally too, but Citus 13.2 plans each of them
// afresh, deparsing and parsing the shard's query, and keeps every such plan
// for the life of the prepared statement: a connection's memory grows by
// megabytes a second under load.)
//
// Writing to a shard's table directly is what Citus's own executor does on
// that node, less the lock that keeps the shard where it is: so a routed
// transaction first takes that lock (lock_shard_metadata, the ShareLock that
// a shard move's ExclusiveLock waits for), and each row it locks comes with
// a check, read after that lock, that the node still holds the row's shard.
// A shard that moved since the map was read fails that check (or its table
// is gone): the transaction rolls back having decided nothing, and its
// checks go through the coordinator (a hop, never a wrong answer) while the
// map is read again. The map is also read again every routeRefresh.
//
// Only checks that touch bucket rows alone are routed: grants, the ledger
// and request IDs live in tables of their own, reached through the
// coordinator. Routing needs the application's role to own the bucket
// tables (Citus lets only owners take shard locks); otherwise checks go
// through the coordinator.

// routeRefresh is how often a router reads the shard map again.
const routeRefresh = 10 * time.Second

// Router sends checks to the Citus nodes that hold their rows. It is safe
// for concurrent use.
type Router struct {
	app   *pgxpool.Pool
	slots int // batches in flight, over all nodes (ClientConfig.CoalesceConns)

	routes atomic.Pointer[routes]
	// loading is set while a refresh runs; goroutines counts refreshes for
	// Client.Close.
	loading    atomic.Bool
	goroutines sync.WaitGroup

	mu     sync.Mutex
	nodes  Pools                         // the nodes' pools, by "host:port"
	byAddr map[string]*Node              // the nodes routed to so far
	stmts  map[string]*sqlgen.Statements // by shard table and placement check
	closed bool
}

// routes is one reading of the shard maps.
type routes struct {
	tables   [2]*shardMap                 // by Storage; nil: that table's checks are not routed
	stmts    map[int64]*sqlgen.Statements // by shard ID: on its table; only shards routed to
	nodes    map[string]*Node
	loadedAt time.Time
}

// Node is a Citus node checks are sent to.
type Node struct {
	// Pool reaches the node: made from the application's pool's settings
	// (host and port replaced), or the application's own pool for the node
	// it is on.
	Pool *pgxpool.Pool
	// Slots is how many coalesced transactions the node's checks should
	// run at once: its share of the client's.
	Slots int
}

// NewRouter returns a Router of the checks of app's database, which run
// slots coalesced transactions at once over all nodes. Call Reload before
// its first Route.
func NewRouter(app *pgxpool.Pool, slots int) *Router {
	r := &Router{app: app, slots: slots, nodes: Pools{app: app}, stmts: make(map[string]*sqlgen.Statements)}
	r.routes.Store(&routes{})
	return r
}

// Route returns the node that holds every row of q and the dialect to speak
// there (the routed one, on the shards' own tables), or nil when there is
// none (rows on several nodes, a table not routed, a request that writes
// more than buckets, no map yet); it starts a refresh of the map when it is
// old.
func (r *Router) Route(q *engine.Request) (*Node, engine.Dialect) {
	rt := r.routes.Load()
	if time.Since(rt.loadedAt) > routeRefresh {
		r.Refresh()
	}
	if !q.BucketsOnly() {
		return nil, nil
	}
	var at string
	for _, c := range q.Charges {
		m := rt.tables[c.Row.Storage]
		if m == nil {
			return nil, nil
		}
		id, n, ok := m.shardOf(c.Row.Key)
		if !ok || rt.stmts[id] == nil || at != "" && n != at {
			return nil, nil
		}
		at = n
	}
	return rt.nodes[at], engine.OnShards{Map: rt}
}

// Refresh reads the shard map again in the background, unless a reading is
// under way.
func (r *Router) Refresh() {
	if !r.loading.CompareAndSwap(false, true) {
		return
	}
	r.goroutines.Go(func() {
		defer r.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), routeRefresh)
		defer cancel()
		r.Reload(ctx)
	})
}

// Reload reads the shard maps; if that fails, r routes by the maps it has
// (none at first) and tries again at the next refresh: a stale map costs
// hops, not answers.
func (r *Router) Reload(ctx context.Context) {
	if err := r.load(ctx); err != nil {
		var rt routes
		if old := r.routes.Load(); old != nil {
			rt = *old
		}
		rt.loadedAt = time.Now()
		r.routes.Store(&rt)
	}
}

// load reads the shard maps of the bucket tables and makes pools for nodes
// new to r. A table that is not hash-distributed by key (or not there) is
// not routed; other errors are returned, and r routes as before.
func (r *Router) load(ctx context.Context) error {
	var rt routes
	var owner bool
	if err := r.app.QueryRow(ctx, `SELECT coalesce(bool_and(pg_catalog.pg_has_role(relowner, 'USAGE')), false)
FROM pg_catalog.pg_class WHERE oid IN (pg_catalog.to_regclass($1), pg_catalog.to_regclass($2))`,
		sqlgen.DurableTable, sqlgen.EphemeralTable).Scan(&owner); err != nil {
		return err
	}
	for s, table := range [...]string{engine.Durable: sqlgen.DurableTable, engine.Ephemeral: sqlgen.EphemeralTable} {
		if !owner {
			break
		}
		m, err := loadShardMap(ctx, r.app, table)
		switch {
		case errors.Is(err, errNotHashDistributed), errors.Is(err, engine.ErrNotMigrated):
		case err != nil:
			return err
		default:
			rt.tables[s] = m
		}
	}
	// The node the application's pool is on runs its checks on that pool.
	var self string
	var host string
	var port int32
	err := r.app.QueryRow(ctx, `SELECT nodename, nodeport FROM pg_catalog.pg_dist_node
WHERE groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group) AND noderole = 'primary'`).Scan(&host, &port)
	switch {
	case err == nil:
		self = net.JoinHostPort(host, strconv.Itoa(int(port)))
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errClosed
	}
	r.nodes.self = self
	rt.nodes = make(map[string]*Node)
	rt.stmts = make(map[int64]*sqlgen.Statements)
	// The client's coalesced transactions are shared out among the nodes,
	// at least one each.
	var addrs []string
	for _, m := range rt.tables {
		if m != nil {
			addrs = append(addrs, m.nodes()...)
		}
	}
	slices.Sort(addrs)
	slots := max(r.slots/max(len(slices.Compact(addrs)), 1), 1)
	for _, m := range rt.tables {
		if m == nil {
			continue
		}
		for _, sh := range m.shards {
			if sh.node == "" || !sh.single {
				continue
			}
			n, err := r.nodeLocked(sh.node, slots)
			if err != nil {
				return err
			}
			rt.nodes[sh.node] = n
			// Each lock and relock also says whether this node still holds
			// the shard, read after the guard's lock (see shardRows).
			placed := ", " + sqlgen.Placed(sh.id, sh.group)
			st := r.stmts[sh.name+placed]
			if st == nil {
				ns := sqlgen.Buckets(sh.name, placed)
				st = &ns
				r.stmts[sh.name+placed] = st
			}
			rt.stmts[sh.id] = st
		}
	}
	rt.loadedAt = time.Now()
	r.routes.Store(&rt)
	return nil
}

// nodeLocked returns the node at addr, making it (and its pool) the first
// time, with slots.
func (r *Router) nodeLocked(addr string, slots int) (*Node, error) {
	if n := r.byAddr[addr]; n != nil {
		return n, nil
	}
	pool, err := r.nodes.Get(context.Background(), addr)
	if err != nil {
		return nil, err
	}
	n := &Node{Pool: pool, Slots: slots}
	if r.byAddr == nil {
		r.byAddr = make(map[string]*Node)
	}
	r.byAddr[addr] = n
	return n, nil
}

// nodePoolConfig is the application's pool configuration for the node at
// addr ("host:port"): the same user, database, credentials, TLS settings and
// pool sizes.
func nodePoolConfig(app *pgxpool.Config, addr string) (*pgxpool.Config, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return nil, err
	}
	cfg := app.Copy()
	cc := cfg.ConnConfig
	cc.Host, cc.Port, cc.Fallbacks = host, uint16(port), nil
	if cc.TLSConfig != nil {
		cc.TLSConfig = cc.TLSConfig.Clone()
		cc.TLSConfig.ServerName = host
	}
	return cfg, nil
}

// Retry says whether err, from a check routed to a node, leaves the check
// to be sent through the coordinator: the node could not be reached
// (nothing ran), or a shard left it (the placement check, or the shard's
// table dropped after a move: nothing was decided either way). The router
// is refreshed meanwhile.
func Retry(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || moved(err)
}

// moved says whether err failed a routed transaction because a shard left
// its node.
func moved(err error) bool {
	return errors.Is(err, engine.ErrShardMoved) || engine.SQLState(err) == pgerrcode.UndefinedTable
}

// Close waits for refreshes and closes the pools r made; no check may be in
// flight on them.
func (r *Router) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.goroutines.Wait()
	r.nodes.Close()
}

var errClosed = errors.New("pgratelimit: router closed")

// Table returns the statements of the shard table that holds r: the
// engine's ShardMap.
func (rt *routes) Table(s engine.Storage, r engine.Row) *sqlgen.Table {
	id, _, _ := rt.tables[s].shardOf(r.Key)
	return &rt.stmts[id].One
}

// Shards returns the IDs of the shards that hold rows, sorted, as an array
// parameter: the engine's ShardMap.
func (rt *routes) Shards(rows []engine.Row) string {
	var ids []int64
	for _, r := range rows {
		id, _, _ := rt.tables[r.Storage].shardOf(r.Key)
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return sqlgen.Int64Array(len(ids), func(i int) int64 { return ids[i] })
}

package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
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

// router sends checks to the Citus nodes that hold their rows.
type router struct {
	app   *pgxpool.Pool
	slots int // batches in flight, over all nodes (ClientConfig.CoalesceConns)

	routes atomic.Pointer[routes]
	// loading is set while a refresh runs; goroutines counts refreshes for
	// Client.Close.
	loading    atomic.Bool
	goroutines sync.WaitGroup

	mu     sync.Mutex
	nodes  map[string]*node              // by "host:port"
	stmts  map[string]*sqlgen.Statements // by shard table and placement check
	closed bool
}

// routes is one reading of the shard maps.
type routes struct {
	tables   [2]*shardMap                 // by Storage; nil: that table's checks are not routed
	stmts    map[int64]*sqlgen.Statements // by shard ID: on its table; only shards routed to
	nodes    map[string]*node
	loadedAt time.Time
}

// node is a Citus node checks are sent to, with its own coalescer.
type node struct {
	pool *pgxpool.Pool
	co   *coalescer
	app  bool // pool is the application's own
}

func newRouter(app *pgxpool.Pool, slots int) *router {
	return &router{app: app, slots: slots, nodes: make(map[string]*node), stmts: make(map[string]*sqlgen.Statements)}
}

// nodeOf returns the node that holds every row of q, with the routes that
// say so, or nil when there is none (rows on several nodes, a table not
// routed, a request that writes more than buckets, no map yet); it starts a
// refresh of the map when it is old.
func (r *router) nodeOf(q *request) (*node, *routes) {
	rt := r.routes.Load()
	if time.Since(rt.loadedAt) > routeRefresh {
		r.refresh()
	}
	if q.kind != account.OpCharge || q.id != "" {
		return nil, nil
	}
	var at string
	for _, c := range q.charges {
		m := rt.tables[c.row.storage]
		if m == nil || c.grants || c.ledger {
			return nil, nil
		}
		id, n, ok := m.shardOf(c.row.key)
		if !ok || rt.stmts[id] == nil || at != "" && n != at {
			return nil, nil
		}
		at = n
	}
	return rt.nodes[at], rt
}

// refresh reads the shard map again in the background, unless a reading is
// under way.
func (r *router) refresh() {
	if !r.loading.CompareAndSwap(false, true) {
		return
	}
	r.goroutines.Go(func() {
		defer r.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), routeRefresh)
		defer cancel()
		r.reload(ctx)
	})
}

// reload reads the shard maps; if that fails, r routes by the maps it has
// (none at first) and tries again at the next refresh: a stale map costs
// hops, not answers.
func (r *router) reload(ctx context.Context) {
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
func (r *router) load(ctx context.Context) error {
	var rt routes
	var owner bool
	if err := r.app.QueryRow(ctx, `SELECT coalesce(bool_and(pg_catalog.pg_has_role(relowner, 'USAGE')), false)
FROM pg_catalog.pg_class WHERE oid IN (pg_catalog.to_regclass($1), pg_catalog.to_regclass($2))`,
		DurableTable, EphemeralTable).Scan(&owner); err != nil {
		return err
	}
	for s, table := range [...]string{Durable: DurableTable, Ephemeral: EphemeralTable} {
		if !owner {
			break
		}
		m, err := loadShardMap(ctx, r.app, table)
		switch {
		case errors.Is(err, errNotHashDistributed), errors.Is(err, ErrNotMigrated):
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
		return ErrClosed
	}
	rt.nodes = make(map[string]*node)
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
			n, err := r.nodeLocked(sh.node, sh.node == self, slots)
			if err != nil {
				return err
			}
			rt.nodes[sh.node] = n
			// Each lock and relock also says whether this node still holds
			// the shard, read after the guard's lock (see shardRows).
			placed := fmt.Sprintf(`, (SELECT count(*) FROM pg_catalog.pg_dist_placement WHERE shardid = %d AND groupid = %d)`, sh.id, sh.group)
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

// nodeLocked returns the node at addr, making it (and its pool: the
// application's when app) the first time, with a coalescer of slots.
func (r *router) nodeLocked(addr string, app bool, slots int) (*node, error) {
	if n := r.nodes[addr]; n != nil {
		return n, nil
	}
	pool := r.app
	if !app {
		cfg, err := nodePoolConfig(r.app.Config(), addr)
		if err != nil {
			return nil, err
		}
		if pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
			return nil, err
		}
	}
	n := &node{pool: pool, co: newCoalescer(pool, slots), app: app}
	r.nodes[addr] = n
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

// unreachable says whether err is a failure to connect, before anything
// ran: the check can go to the coordinator instead.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// moved says whether err failed a routed transaction because a shard left
// the node: the placement check, or the shard's table dropped after a move
// (nothing was decided either way).
func moved(err error) bool {
	return errors.Is(err, errShardMoved) || sqlState(err) == pgerrcode.UndefinedTable
}

// close waits for refreshes and closes the pools r made; no check may be in
// flight on them.
func (r *router) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.goroutines.Wait()
	for _, n := range r.nodes {
		n.co.goroutines.Wait()
		if !n.app {
			n.pool.Close()
		}
	}
}

// errShardMoved fails a routed transaction whose node no longer holds one of
// its shards: it rolled back, and its checks go through the coordinator.
var errShardMoved = errors.New("pgratelimit: a shard moved off the node the check was sent to")

// onShards is the dialect of a transaction routed to a Citus node: plain
// PostgreSQL's, on the tables of the shards that hold its rows (see router).
// Comparable: the batches of one reading of the map share it.
type onShards struct{ rt *routes }

func (onShards) kind() Dialect                   { return Citus }
func (d onShards) shape(int, bool) shape         { return shardRows(d) }
func (onShards) set(pairs []string) []stmt       { return postgres{}.set(pairs) }
func (onShards) oneRowBatches() bool             { return false }
func (onShards) deleter(ct cleanupTable) deleter { return citus{}.deleter(ct) }

// shardRows is oneRow on each row's shard table, after the guard that keeps
// the shards on the node.
type shardRows struct{ rt *routes }

// table returns the statements of the shard table that holds r.
func (d shardRows) table(s Storage, r row) *sqlgen.Table {
	id, _, _ := d.rt.tables[s].shardOf(r.key)
	return &d.rt.stmts[id].One
}

// insert: the attempt's first row's insert, the first statement to touch a
// shard, takes the guard's locks first (see guard).
func (d shardRows) insert(s Storage, rows []row, a *attempt) []stmt {
	return perRow(rows, func(r row) stmt {
		ts := d.table(s, r)
		if r == a.rows[0] {
			return stmt{sql: ts.GuardedInsert, args: []any{r.prefix, r.key, a.interval(r), a.clock, d.shards(a)}}
		}
		return stmt{sql: ts.Insert, args: []any{r.prefix, r.key, a.interval(r), a.clock}}
	})
}

func (d shardRows) lock(s Storage, rows []row, a *attempt) []stmt {
	scan := a.scanRows(s, false, true)
	return perRow(rows, func(r row) stmt {
		return stmt{sql: a.lockSQL(d.table(s, r), s), args: []any{r.prefix, r.key, a.clock}, scan: scan}
	})
}

func (d shardRows) relock(s Storage, rows []row, a *attempt) []stmt {
	scan := a.scanRows(s, false, true)
	return perRow(rows, func(r row) stmt {
		return stmt{sql: a.relockSQL(d.table(s, r), s), args: []any{r.prefix, r.key, a.interval(r), a.clock}, scan: scan}
	})
}

func (d shardRows) update(s Storage, rows []row, a *attempt) []stmt {
	return perRow(rows, func(r row) stmt {
		return stmt{sql: d.table(s, r).Update, args: a.updateArgs(r)}
	})
}

func (shardRows) values(sql sqlgen.Rows, rows [][]any, scan func(rowScanner) error) []stmt {
	return oneRow{}.values(sql, rows, scan)
}

func (shardRows) settings() []string    { return nil }
func (shardRows) clock(*attempt) []stmt { return nil }

// guard takes the shards' metadata locks (ShareLock, 5: what Citus's
// executor takes before it writes to a shard, and a shard move waits for):
// in the first insert (insert), or, in an attempt that inserts nothing, in
// a statement of its own. Whether this node still holds each shard is read
// after it, with each row (the lock and relock statements' last column, see
// scanRows): a row of a shard that moved fails the transaction before
// anything is decided.
func (d shardRows) guard(a *attempt) []stmt {
	if a.mode != skipLockedNoInsert {
		return nil
	}
	return []stmt{{sql: `SELECT pg_catalog.lock_shard_metadata(5, $1::text::bigint[])`, args: []any{d.shards(a)}}}
}

// shards is the array of the attempt's rows' shards, sorted.
func (d shardRows) shards(a *attempt) string {
	var ids []int64
	for _, r := range a.rows {
		id, _, _ := d.rt.tables[r.storage].shardOf(r.key)
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return sqlgen.Int64Array(len(ids), func(i int) int64 { return ids[i] })
}

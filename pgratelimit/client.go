package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrClosed is returned by the checks of a Client's limiters once Close has
// been called.
var ErrClosed = errors.New("pgratelimit: client closed")

// ClientConfig configures a Client. The zero value is valid.
type ClientConfig struct {
	// CoalesceConns is how many coalesced transactions (so pool
	// connections) the client's limiters run at once; checks beyond them
	// queue and go in the next batches (see Config.DisableCoalescing).
	// Fewer means bigger batches; more lets a database with cores to spare
	// work on several batches at once. At most the pool's MaxConns. On
	// Citus, checks routed to the nodes (see DisableRouting) share them
	// out, at least one per node; through the coordinator, where a batch
	// holds one row, at least half of MaxConns run at once. Defaults to 2,
	// the best measured on a 2-core server (see README, Performance).
	CoalesceConns int

	// Dialect names the kind of database the bucket tables are in.
	// Defaults to DetectDialect: NewClient asks the database.
	Dialect Dialect

	// DisableRouting keeps every check on the pool's own database. By
	// default, on Citus, a check whose buckets' shards are all on one node
	// goes straight to that node, through a pool the client makes for it
	// with the pool's own settings (host and port replaced), so that the
	// coordinator does no work for it; see the README's "Citus".
	DisableRouting bool
}

// Client is what the limiters of one pool share: the coalescer that decides
// their concurrent checks together, and the database's dialect (plain
// PostgreSQL or Citus). Make one per pool with NewClient, make limiters with
// NewLimiter, and Close it when the application stops: Close waits for the
// checks in flight, so none is cut off mid-transaction.
//
// New(pool, cfg) makes a limiter of the pool's default client instead, which
// is made at the pool's first limiter, detects the dialect at its first
// check, runs as many coalesced transactions at once as the most any of its
// limiters asks for (Config.CoalesceConns), and is never closed. Prefer an
// explicit Client in new code: its settings are in one place, a failed
// detection is an error of NewClient rather than of a check, and Close
// drains it.
//
// A Client is safe for concurrent use.
type Client struct {
	pool  *pgxpool.Pool
	co    *coalescer
	gate  gate
	slots int // batches in flight per pool (ClientConfig.CoalesceConns)

	routing bool                   // route checks to Citus nodes (see router)
	route   atomic.Pointer[router] // set once the dialect is Citus, if routing

	dia       atomic.Pointer[dialect] // nil until known
	detecting sync.Mutex              // one detection at a time

	// The deny caches of the client's limiters, by Prefix, so that a
	// refund, reset or grant through any of them clears the key's entries.
	denyMu     sync.RWMutex
	denyCaches map[string][]*denyCache
}

// NewClient returns a Client for the bucket tables in pool's database. With
// cfg.Dialect DetectDialect it asks the database which dialect it speaks,
// and returns that query's error if it fails (set cfg.Dialect to start
// without asking). A missing schema is not an error here: checks report it as
// ErrNotMigrated.
func NewClient(ctx context.Context, pool *pgxpool.Pool, cfg ClientConfig) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if cfg.CoalesceConns < 0 {
		return nil, fmt.Errorf("%w: CoalesceConns must be >= 0, got %d", ErrInvalidConfig, cfg.CoalesceConns)
	}
	switch cfg.Dialect {
	case DetectDialect, Postgres, Citus:
	default:
		return nil, fmt.Errorf("%w: Dialect must be DetectDialect, Postgres or Citus, got %d", ErrInvalidConfig, int(cfg.Dialect))
	}
	c := newClient(pool, orDefault(cfg.CoalesceConns, defaultCoalesceConns))
	c.routing = !cfg.DisableRouting
	if cfg.Dialect != DetectDialect {
		c.setDialect(ctx, dialectOf(cfg.Dialect))
		return c, nil
	}
	if _, err := c.Detect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func newClient(pool *pgxpool.Pool, coalesceConns int) *Client {
	slots := max(min(coalesceConns, int(pool.Config().MaxConns)), 1)
	c := &Client{pool: pool, co: newCoalescer(pool, slots), slots: slots, routing: true}
	c.gate.drained = make(chan struct{})
	return c
}

// orDefault is v, or def when v is zero.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// NewLimiter returns a Limiter for cfg whose checks go through c. It
// validates cfg (ErrInvalidConfig names the bad field) and does not touch
// the database. Config.CoalesceConns must be 0: the client's
// ClientConfig.CoalesceConns applies.
func (c *Client) NewLimiter(cfg Config) (*Limiter, error) {
	if cfg.CoalesceConns != 0 {
		return nil, fmt.Errorf("%w: CoalesceConns is set on the Client (ClientConfig.CoalesceConns), not on its limiters; got %d", ErrInvalidConfig, cfg.CoalesceConns)
	}
	return newLimiter(c, cfg)
}

// Dialect reports the dialect c speaks: DetectDialect until it is known (a
// default client learns it at its first check).
func (c *Client) Dialect() Dialect {
	if d := c.dia.Load(); d != nil {
		return (*d).kind()
	}
	return DetectDialect
}

// Detect asks the database again which dialect it speaks, and speaks it
// from then on: call it after distributing the bucket tables
// (migrations.Distribute) under a running application. On an error c keeps
// the dialect it had.
func (c *Client) Detect(ctx context.Context) (Dialect, error) {
	c.detecting.Lock()
	defer c.detecting.Unlock()
	d, err := detectDialect(ctx, c.pool)
	if err != nil {
		return c.Dialect(), err
	}
	c.setDialect(ctx, d)
	return d.kind(), nil
}

// setDialect makes c speak d from now on; on Citus it starts routing (its
// first shard map read with ctx).
func (c *Client) setDialect(ctx context.Context, d dialect) {
	if d.oneRowBatches() {
		// One row per batch: let as many run at once as the pool allows,
		// as checks of their own would.
		c.co.atLeast(int(c.pool.Config().MaxConns) / 2)
	}
	if d.kind() == Citus && c.routing && c.route.Load() == nil {
		r := newRouter(c.pool, c.slots)
		r.reload(ctx)
		c.route.Store(r)
	}
	c.dia.Store(&d)
}

// dialect returns c's dialect, asking the database the first time (a
// default client); a failed detection is the check's error, and the next
// check asks again.
func (c *Client) dialect(ctx context.Context) (dialect, error) {
	if d := c.dia.Load(); d != nil {
		return *d, nil
	}
	c.detecting.Lock()
	defer c.detecting.Unlock()
	if d := c.dia.Load(); d != nil {
		return *d, nil
	}
	d, err := detectDialect(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	c.setDialect(ctx, d)
	return d, nil
}

// Close stops c: checks that start after it return ErrClosed, and it waits
// for the checks in flight to be decided and for the coalescer's
// transactions to end, or for ctx to end (then it returns ctx's error; the
// rest still finish in the background). It does not close the pool.
// Calling it again waits again.
func (c *Client) Close(ctx context.Context) error {
	c.gate.close()
	idle := make(chan struct{})
	go func() {
		<-c.gate.drained
		c.co.goroutines.Wait()
		if r := c.route.Load(); r != nil {
			r.close()
		}
		close(idle)
	}()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gate counts the calls in flight through a client, until it is closed.
type gate struct {
	n       atomic.Int64 // calls in flight, plus closedBit once closed
	drained chan struct{}
}

const closedBit = 1 << 62

// enter counts a call in, or says false once the gate is closed.
func (g *gate) enter() bool {
	for {
		n := g.n.Load()
		if n&closedBit != 0 {
			return false
		}
		if g.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (g *gate) leave() {
	if g.n.Add(-1) == closedBit {
		close(g.drained)
	}
}

func (g *gate) close() {
	if g.n.Or(closedBit) == 0 { // nothing in flight, and not closed before
		close(g.drained)
	}
}

// The default client of each pool (see New); an entry goes when its pool is
// garbage collected. This is the only package-level state.
var defaultClients struct {
	sync.Mutex
	m map[weak.Pointer[pgxpool.Pool]]*Client
}

// defaultClient returns pool's default client, making it if needed.
func defaultClient(pool *pgxpool.Pool) *Client {
	wp := weak.Make(pool)
	defaultClients.Lock()
	defer defaultClients.Unlock()
	if defaultClients.m == nil {
		defaultClients.m = make(map[weak.Pointer[pgxpool.Pool]]*Client)
	}
	c := defaultClients.m[wp]
	if c == nil {
		c = newClient(pool, defaultCoalesceConns)
		defaultClients.m[wp] = c
		runtime.AddCleanup(pool, func(wp weak.Pointer[pgxpool.Pool]) {
			defaultClients.Lock()
			delete(defaultClients.m, wp)
			defaultClients.Unlock()
		}, wp)
	}
	return c
}

// run decides q, whose first charge is first's, in one transaction of c's:
// through the coalescer when coalesce, else alone. op names the call in
// errors.
func (c *Client) run(q *request, first *Limiter, coalesce bool, op string) (MultiResult, error) {
	if !c.gate.enter() {
		return MultiResult{}, ErrClosed
	}
	defer c.gate.leave()
	d, err := c.dialect(q.ctx)
	if err != nil {
		return MultiResult{}, err
	}
	if r := c.route.Load(); r != nil {
		if n, rt := r.nodeOf(q); n != nil {
			out, err := runOn(n.pool, n.co, q, first.settings(onShards{rt}), first.metrics, coalesce, op)
			if !unreachable(err) && !moved(err) {
				return out, err
			}
			// The node is down or gone, or a shard moved: the coordinator
			// knows where the shards are now.
			q.err = nil
			r.refresh()
		}
	}
	return runOn(c.pool, c.co, q, first.settings(d), first.metrics, coalesce, op)
}

// runOn decides q on pool: through co when coalesce, else alone.
func runOn(pool *pgxpool.Pool, co *coalescer, q *request, set settings, in *instruments, coalesce bool, op string) (MultiResult, error) {
	if coalesce {
		return co.do(q, set, in)
	}
	return runAlone(pool, q, set, op)
}

// addDenyCache registers the deny cache of a limiter of prefix.
func (c *Client) addDenyCache(prefix string, dc *denyCache) {
	c.denyMu.Lock()
	defer c.denyMu.Unlock()
	if c.denyCaches == nil {
		c.denyCaches = make(map[string][]*denyCache)
	}
	c.denyCaches[prefix] = append(c.denyCaches[prefix], dc)
}

// forgetDenied clears key's deny cache entries under prefix: its buckets may
// hold more than when it was denied.
func (c *Client) forgetDenied(prefix, key string) {
	c.denyMu.RLock()
	defer c.denyMu.RUnlock()
	for _, dc := range c.denyCaches[prefix] {
		dc.forget(key)
	}
}

package pgratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/citus"
	"github.com/pgratelimit/pgratelimit/internal/coalesce"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// ClientConfig configures a Client. The zero value is valid.
type ClientConfig struct {
	// CoalesceConns is how many coalesced transactions (so pool
	// connections) the client's limiters run at once at most; checks
	// beyond them queue and go in the next batches (see
	// Config.DisableCoalescing). A check that finds none running runs at
	// once; a transaction beyond the first starts only when 32 checks wait
	// for it (fewer cost less in the running one's next batch). Fewer means
	// bigger batches; more lets a database with cores to spare work on
	// several batches at once. At most the pool's MaxConns. On
	// Citus, checks routed to the nodes (see DisableRouting) share them
	// out, at least one per node; through the coordinator, where a batch
	// holds one row, at least half of MaxConns run at once. Defaults to 2,
	// the best measured on a 2-core server (see README, Performance).
	CoalesceConns int

	// DisableRouting keeps every check on the pool's own database. By
	// default, on Citus, a check whose buckets' shards are all on one node
	// goes straight to that node, through a pool the client makes for it
	// with the pool's own settings (host and port replaced), so that the
	// coordinator does no work for it; see the README's "Citus".
	DisableRouting bool

	// DisablePolicyRecord stops the client's limiters recording their
	// policies in pgratelimit_policies (see docs/overrides.md): for tools
	// that look at an application's keys under its policy, such as the
	// CLI, and must not show up as one of its instances. Defaults to
	// false: each limiter records its policy at its first operation.
	DisablePolicyRecord bool
}

// Client is what the limiters of one pool share: the coalescer that decides
// their concurrent checks together, and the database's dialect (plain
// PostgreSQL or Citus). Make one per pool with NewClient, make limiters with
// NewLimiter, and Close it when the application stops: Close waits for the
// checks in flight, so none is cut off mid-transaction.
//
// New(pool, cfg) is NewLimiter on a client of the limiter's own, which
// learns the dialect at its first check and is never closed: fine for a
// limiter or two; prefer an explicit Client for more, so that their checks
// share batches, a failed detection is an error of NewClient rather than of
// a check, and Close drains them.
//
// A Client is safe for concurrent use.
type Client struct {
	mem   *engine.Memory // NewMemoryClient's: no database
	pool  *pgxpool.Pool
	co    *coalesce.Coalescer
	gate  gate
	slots int // batches in flight per pool (ClientConfig.CoalesceConns)

	routing  bool                         // route checks to Citus nodes
	noRecord bool                         // ClientConfig.DisablePolicyRecord
	route    atomic.Pointer[citus.Router] // set once the dialect is Citus, if routing
	nodesMu  sync.Mutex
	nodes    map[*citus.Node]*coalesce.Coalescer // the coalescers of the nodes routed to

	dia       atomic.Pointer[engine.Dialect] // nil until known
	txDia     atomic.Pointer[engine.Dialect] // as a caller's transaction found it, while dia is unknown (txDialect)
	detecting sync.Mutex                     // one detection at a time

	// The deny caches of the client's limiters, by Prefix, so that a
	// refund, reset or grant through any of them clears the key's entries.
	denyMu     sync.RWMutex
	denyCaches map[string][]*denyCache

	// The policies the client's limiters have recorded (their Record
	// arguments, as one string): each once.
	policies sync.Map

	// ones and leaseOps recycle the requests of its calls of one charge
	// and of its semaphores' operations (see oneCharge).
	ones, leaseOps sync.Pool
}

// notedPolicy says whether a limiter of c has recorded the policy of args
// already, and notes that it has.
func (c *Client) notedPolicy(args []any) bool {
	_, seen := c.policies.LoadOrStore(fmt.Sprint(args...), true)
	return seen
}

// defaultCoalesceConns is ClientConfig.CoalesceConns's default.
const defaultCoalesceConns = 2

// NewClient returns a Client for the bucket tables in pool's database. It
// asks the database whether they are Citus distributed tables, and returns
// that query's error if it fails: checks go to the nodes that hold their
// rows on Citus (see ClientConfig.DisableRouting). Tables distributed later
// (migrations.Distribute under a running application) work through the
// coordinator until the application makes a new Client (or restarts). A
// missing schema is not an error here: checks report it as ErrNotMigrated.
func NewClient(ctx context.Context, pool *pgxpool.Pool, cfg ClientConfig) (*Client, error) {
	if pool == nil {
		return nil, configError("pool", "is nil")
	}
	if cfg.CoalesceConns < 0 {
		return nil, configError("ClientConfig.CoalesceConns", "must be >= 0, got %d", cfg.CoalesceConns)
	}
	c := newClient(pool, orDefault(cfg.CoalesceConns, defaultCoalesceConns))
	c.routing = !cfg.DisableRouting
	c.noRecord = cfg.DisablePolicyRecord
	d, err := citus.Detect(ctx, engine.PgxExecutor{Q: c.pool})
	if err != nil {
		return nil, err
	}
	c.setDialect(ctx, d)
	return c, nil
}

func newClient(pool *pgxpool.Pool, coalesceConns int) *Client {
	slots := max(min(coalesceConns, int(pool.Config().MaxConns)), 1)
	c := &Client{pool: pool, co: coalesce.New(pool, slots), slots: slots, routing: true}
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

// NewMemoryClient returns a Client whose limiters keep their buckets in
// this process's memory, for the tests of code that takes a *Limiter
// (handlers, jobs) without a database. Its limiters decide every operation
// with the same account model, as one transaction would, each all or
// nothing and one at a time: checks, AllowAll over its limiters, Wait,
// Peek, Refund, Reset, grants, debits, settlements, request IDs and the
// ledger. What it cannot do: the caller's transactions (In: every
// operation is ErrInvalidArgument), Semaphores and Config.Alerts (they need
// the database: ErrInvalidConfig), more than one process, and keeping
// anything when the process ends. Time is Config.Clock's, else the
// process's clock (a limiter on the database reads the database's).
func NewMemoryClient() *Client {
	c := &Client{mem: engine.NewMemory(), slots: 1, routing: false}
	c.gate.drained = make(chan struct{})
	return c
}

// NewLimiter returns a Limiter for cfg whose checks go through c. It
// validates cfg (a *ConfigError names the bad field) and does not touch the
// database.
func (c *Client) NewLimiter(cfg Config) (*Limiter, error) {
	return newLimiter(c, cfg)
}

// setDialect makes c speak d from now on; on Citus it starts routing (its
// first shard map read with ctx).
func (c *Client) setDialect(ctx context.Context, d engine.Dialect) {
	if d.OneRowBatches() {
		// One row per batch: let as many run at once as the pool allows,
		// as checks of their own would.
		c.co.AtLeast(int(c.pool.Config().MaxConns) / 2)
	}
	if d.Name() == "citus" && c.routing && c.route.Load() == nil {
		r := citus.NewRouter(c.pool, c.slots)
		r.Reload(ctx)
		c.route.Store(r)
	}
	c.dia.Store(&d)
}

// dialect returns c's dialect, asking the database the first time (a
// client of New); a failed detection is the check's error, and the next
// check asks again.
func (c *Client) dialect(ctx context.Context) (engine.Dialect, error) {
	if d := c.dia.Load(); d != nil {
		return *d, nil
	}
	c.detecting.Lock()
	defer c.detecting.Unlock()
	if d := c.dia.Load(); d != nil {
		return *d, nil
	}
	d, err := citus.Detect(ctx, engine.PgxExecutor{Q: c.pool})
	if err != nil {
		return nil, err
	}
	c.setDialect(ctx, d)
	return d, nil
}

// Close stops c: checks that start after it return ErrClosed, and it waits
// for the checks in flight to be decided and for the coalescer's
// transactions to end, or for ctx to end (then it returns ctx's error; the
// rest still finish in the background). It ends the goroutines that the
// coalescer keeps waiting for its next batches (one per CoalesceConns at
// most). It does not close the pool. Calling it again waits again.
func (c *Client) Close(ctx context.Context) error {
	c.gate.close()
	idle := make(chan struct{})
	go func() {
		<-c.gate.drained
		if c.co != nil {
			c.co.Wait()
		}
		c.nodesMu.Lock()
		for _, co := range c.nodes {
			co.Wait()
		}
		c.nodesMu.Unlock()
		if r := c.route.Load(); r != nil {
			r.Close()
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

// run decides q with the settings set (its dialect aside) in one
// transaction of c's: through a coalescer when coalesce, else alone; on
// Citus on the node that holds its rows, when one does. seen is told the
// size of a coalesced batch; what names the call in errors.
func (c *Client) run(q *engine.Request, set engine.Settings, seen func(context.Context, int), coalesce bool, what string) error {
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.leave()
	if c.mem != nil {
		return c.mem.Run(q, set)
	}
	d, err := c.dialect(q.Ctx)
	if err != nil {
		return err
	}
	if r := c.route.Load(); r != nil {
		if n, nd := r.Route(q); n != nil {
			set.Dialect = nd
			err := c.runOn(n.Pool, c.nodeCoalescer(n), q, set, seen, coalesce, what)
			if !citus.Retry(err) {
				return err
			}
			// The node is down or gone, or a shard moved: the coordinator
			// knows where the shards are now.
			q.Err, q.Outcomes = nil, nil
			r.Refresh()
		}
	}
	set.Dialect = d
	return c.runOn(c.pool, c.co, q, set, seen, coalesce, what)
}

// runOn decides q on pool: through co when coalesce, else alone.
func (c *Client) runOn(pool *pgxpool.Pool, co *coalesce.Coalescer, q *engine.Request, set engine.Settings, seen func(context.Context, int), coalesce bool, what string) error {
	if coalesce {
		return co.Do(q, set, seen)
	}
	return engine.RunAlone(pool, q, set, what)
}

// nodeCoalescer is the coalescer of the checks routed to n.
func (c *Client) nodeCoalescer(n *citus.Node) *coalesce.Coalescer {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	co := c.nodes[n]
	if co == nil {
		co = coalesce.New(n.Pool, n.Slots)
		if c.nodes == nil {
			c.nodes = make(map[*citus.Node]*coalesce.Coalescer)
		}
		c.nodes[n] = co
	}
	return co
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

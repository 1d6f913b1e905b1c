// Package coalesce decides the checks that arrive through one pool while its
// transactions are busy together, in shared transactions of the engine's
// one shape, with exactly the results they would get one by one.
package coalesce

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Coalescing: checks that arrive through the limiters of one Client while its
// transactions are busy wait in a queue and are then decided together, in
// arrival order, in one engine transaction. A check that finds
// a free slot and nobody queued runs at once, alone. There is no timer; while
// the pool is idle, the goroutines that ran batches wait for the next ones,
// at most one per slot (see Coalescer.work).
//
// A batch locks with SKIP LOCKED, so it never waits for a row that another
// transaction holds (an AllowNTx in a long transaction, another app
// instance's batch): the checks of such a row, and every later check sharing
// a row with them, are parked in a lane of that row. A lane is a transaction
// that waits for its rows' locks alone, outside the batch slots; checks that
// queue up behind it go in its next transaction together. Each row's checks
// are decided in arrival order, whichever way they go, and two batches of
// one coalescer never hold the same row: a check whose row is in a batch in
// flight waits for the next.
//
// Under load a slot chains its batches (see engine.RunChain): once a batch is
// decided, if it deferred no check and a batch as big waits in the queue,
// that one follows on the same connection, its first statements in the same
// round trip as the previous batch's last ones. It may share rows with that
// batch, which commits first.

const (
	maxBatch = 256
	// openAt is the fewest queued checks for which a batch starts on a
	// free slot while another is busy: a transaction's fixed cost (BEGIN,
	// settings, statements' start and end, COMMIT) is most of a small
	// batch's, and the busy slot takes what is queued soon enough
	// (chained, see runBatch). Below it checks wait for a slot to chain
	// them or to end; an idle coalescer runs a check at once, alone.
	// Measured (docs/performance.md, issue #44), 16 to 48 at 64 checks in
	// flight: 32 gave the most checks per second, at less CPU per check
	// than 16 or 24; from 40 on a second slot seldom opened at 64 in
	// flight, which cost less CPU per check but gave a fifth fewer checks
	// per second.
	openAt = 32
	// queueFactor bounds the queue at this many full batches per slot;
	// beyond it checks run alone, waiting for their rows' locks, as they
	// would without coalescing.
	queueFactor = 4
)

// pending is a check in the coalescer, until it is decided (done).
// Pendings are recycled (Coalescer.pendings) once their Do has received
// done.
type pending struct {
	req  *engine.Request
	set  engine.Settings            // the first charge's limiter's
	seen func(context.Context, int) // told the size of its batch; may be nil
	rows []engine.Row
	one  [1]engine.Row // rows' array for a request of one charge
	done chan struct{} // sent to once (buffered: the sender never waits)
}

// decided tells p's Do that p is decided (or failed): it is the last use
// of p by anyone but that Do.
func (p *pending) decided() { p.done <- struct{}{} }

// lane is one transaction of parked checks, run when the lanes before it on
// its rows (deps) are done.
type lane struct {
	reqs    []*pending
	rows    []engine.Row
	deps    []*lane
	started bool // guarded by Coalescer.mu; no more checks join it
	done    chan struct{}
}

// Coalescer decides the requests given to Do together, in shared
// transactions on its pool. It is safe for concurrent use.
type Coalescer struct {
	pool *pgxpool.Pool
	// goroutines counts the batch and lane goroutines, for Client.Close.
	goroutines sync.WaitGroup

	mu       sync.Mutex
	slots    int // batches in flight at most
	busy     int // batches in flight
	queue    []*pending
	inflight map[engine.Row]int   // rows of the batches in flight
	parked   map[engine.Row]*lane // each row's last lane
	lanes    chan struct{}        // lane transactions in flight, at most cap(lanes)
	// held and mine are formLocked's, kept between its calls so that
	// forming a batch allocates no maps.
	held, mine map[engine.Row]bool
	// idle are the batch goroutines waiting for a batch (see work), each
	// by its channel; waiting counts the Waits under way, during which
	// they end instead.
	idle    []chan []*pending
	waiting int

	// pendings recycles pendings and their channels: a check would
	// allocate both otherwise.
	pendings sync.Pool
}

// New returns a Coalescer that runs up to slots batches at once on pool.
func New(pool *pgxpool.Pool, slots int) *Coalescer {
	return &Coalescer{
		pool:     pool,
		slots:    slots,
		inflight: make(map[engine.Row]int),
		parked:   make(map[engine.Row]*lane),
		held:     make(map[engine.Row]bool),
		mine:     make(map[engine.Row]bool),
		// Lanes wait for row locks on connections of their own: leave the
		// batches theirs.
		lanes: make(chan struct{}, max(int(pool.Config().MaxConns)-slots, 1)),
	}
}

// AtLeast makes c run at least slots batches at once.
func (c *Coalescer) AtLeast(slots int) {
	c.mu.Lock()
	c.slots = max(c.slots, slots)
	c.mu.Unlock()
}

// Wait waits for c's batch and lane goroutines, and ends those waiting for a
// batch: none runs once it returns, unless a Do starts one.
func (c *Coalescer) Wait() {
	c.mu.Lock()
	c.waiting++
	for _, w := range c.idle {
		close(w)
	}
	c.idle = nil
	c.mu.Unlock()
	c.goroutines.Wait()
	c.mu.Lock()
	c.waiting--
	c.mu.Unlock()
}

// Do decides q through c, with requests of equal settings set, and returns
// q's error (its outcome is in q), or its context's as soon as it ends.
// seen, if not nil, is told the size of the batch q went in.
func (c *Coalescer) Do(q *engine.Request, set engine.Settings, seen func(context.Context, int)) error {
	p, _ := c.pendings.Get().(*pending)
	if p == nil {
		p = &pending{done: make(chan struct{}, 1)}
	}
	p.req, p.set, p.seen = q, set, seen
	if len(q.Charges) == 1 { // the usual check: its row in p, no slice of its own
		p.one[0] = q.Charges[0].Row
		p.rows = p.one[:]
	} else {
		p.rows = q.Rows()
	}
	c.mu.Lock()
	switch {
	case len(c.queue) > 0:
		if len(c.queue) >= c.slots*maxBatch*queueFactor {
			c.mu.Unlock()
			c.recycle(p)
			return engine.RunAlone(c.pool, q, set, "check")
		}
		c.queue = append(c.queue, p)
		// The queue may hold only checks whose rows are in a batch in
		// flight: with a slot free, p need not wait for that batch.
		var next [][]*pending
		if c.mayOpen(p.set.Dialect) && !c.anyInflight(p.rows) {
			next = c.formBatchesLocked()
		}
		c.mu.Unlock()
		c.workAll(next)
	case c.anyParked(p.rows):
		c.parkLocked(p)
		c.mu.Unlock()
	case c.mayOpen(p.set.Dialect) && !c.anyInflight(p.rows): // the queue is empty: only when idle
		// An idle coalescer: a batch of one, at once, on this goroutine.
		c.busy++
		c.markInflight(p.rows, 1)
		c.mu.Unlock()
		c.workAll(c.runBatch([]*pending{p}, false))
	default:
		c.queue = append(c.queue, p)
		c.mu.Unlock()
	}
	select {
	case <-p.done:
		c.recycle(p)
		if q.Err != nil && q.Ctx.Err() != nil {
			return q.Ctx.Err() // the caller's own deadline, not the batch's
		}
		return q.Err
	case <-q.Ctx.Done():
		// p is not recycled: its batch or lane may still tell it.
		c.mu.Lock()
		c.queue = slices.DeleteFunc(c.queue, func(o *pending) bool { return o == p })
		c.mu.Unlock()
		// Queued: nothing was spent. In a batch or a lane: the engine skips
		// checks whose context ended before it decided, so at worst tokens
		// are spent without being reported, never reported without being
		// spent.
		return q.Ctx.Err()
	}
}

// recycle puts p back in c.pendings, once no batch or lane holds it.
func (c *Coalescer) recycle(p *pending) {
	*p = pending{done: p.done}
	c.pendings.Put(p)
}

func (c *Coalescer) anyParked(rows []engine.Row) bool {
	return slices.ContainsFunc(rows, func(r engine.Row) bool { return c.parked[r] != nil })
}

func (c *Coalescer) anyInflight(rows []engine.Row) bool {
	return slices.ContainsFunc(rows, func(r engine.Row) bool { return c.inflight[r] > 0 })
}

func (c *Coalescer) markInflight(rows []engine.Row, d int) {
	for _, r := range rows {
		if c.inflight[r] += d; c.inflight[r] == 0 {
			delete(c.inflight, r)
		}
	}
}

// workAll runs each of batches on a goroutine of its own: one waiting for a
// batch, or a new one.
func (c *Coalescer) workAll(batches [][]*pending) {
	if len(batches) == 0 {
		return
	}
	c.mu.Lock()
	for len(batches) > 0 && len(c.idle) > 0 {
		last := len(c.idle) - 1
		c.idle[last] <- batches[0] // buffered: an idle goroutine's is empty
		c.idle = c.idle[:last]
		batches = batches[1:]
	}
	c.mu.Unlock()
	for _, b := range batches {
		c.goroutines.Go(func() { c.work(b) })
	}
}

// work runs batch, then the batches that follow it while there are any, on
// this goroutine; it starts goroutines only for batches beyond the first.
// Then it waits for a batch from workAll, until a Wait ends it: a goroutine
// that runs batch after batch keeps the stack the engine grew, which a new
// one would grow again, copying it at each doubling (a twentieth of the
// client's CPU, issue #44).
func (c *Coalescer) work(batch []*pending) {
	var next chan []*pending
	for {
		for batch != nil {
			more := c.runBatch(batch, true)
			batch = nil
			if len(more) > 0 {
				batch = more[0]
				c.workAll(more[1:])
			}
		}
		c.mu.Lock()
		if c.waiting > 0 {
			c.mu.Unlock()
			return
		}
		if next == nil {
			next = make(chan []*pending, 1)
		}
		c.idle = append(c.idle, next)
		c.mu.Unlock()
		if batch = <-next; batch == nil { // closed by Wait
			return
		}
	}
}

// runBatch decides batch in one transaction that skips locked rows, delivers
// the decided checks' outcomes and parks the others. With chain, checks that
// queued meanwhile follow on its connection (see engine.RunChain), batch after
// batch, while each finds a full batch waiting. It returns the batches that
// may start once it is done.
func (c *Coalescer) runBatch(batch []*pending, chain bool) [][]*pending {
	bc := &batchChain{c: c, chain: chain}
	bc.runs = bc.two[:0]
	first, ctx := bc.start(batch)
	engine.RunChain(ctx, c.pool, first, bc)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	return c.formBatchesLocked()
}

// batchChain is the chain of one slot's batches (see engine.RunChain): it forms
// the next batch from the queue and delivers each one's outcomes.
type batchChain struct {
	c     *Coalescer
	chain bool      // let batches follow the first
	runs  []running // the batches under way: one, and the next once formed
	two   [2]running
}

// running is a batch in a chain, with its plan and the context it runs in.
type running struct {
	plan   *engine.Plan
	batch  []*pending
	ctx    context.Context
	cancel context.CancelFunc
}

// run is the batch of plan p.
func (bc *batchChain) run(p *engine.Plan) running {
	for _, r := range bc.runs {
		if r.plan == p {
			return r
		}
	}
	return running{}
}

// start plans batch as a transaction that skips locked rows.
func (bc *batchChain) start(batch []*pending) (*engine.Plan, context.Context) {
	ctx, cancel := batchContext(batch)
	p := engine.NewPlan(requests(batch), batch[0].set, true, engine.SkipLocked)
	bc.runs = append(bc.runs, running{p, batch, ctx, cancel})
	return p, ctx
}

// next is the batch that follows after on its connection: none after a
// batch that deferred checks (they are parked once it ends, and later checks
// of their rows must queue behind them), and none unless a batch as big as
// after waits (else the checks queued so far are better off in a bigger
// batch later).
func (bc *batchChain) Next(after *engine.Plan, deferred []*engine.Request) (*engine.Plan, context.Context) {
	if !bc.chain || len(deferred) > 0 {
		return nil, nil
	}
	c := bc.c
	c.mu.Lock()
	var b []*pending
	if a := bc.run(after).batch; len(c.queue) >= len(a) {
		b = c.formLocked(a)
	}
	c.mu.Unlock()
	if len(b) == 0 {
		return nil, nil
	}
	return bc.start(b)
}

func (bc *batchChain) Done(p *engine.Plan, deferred []*engine.Request, err error) {
	r := bc.run(p)
	bc.runs = slices.DeleteFunc(bc.runs, func(r running) bool { return r.plan == p })
	if seen := r.batch[0].seen; seen != nil {
		seen(r.ctx, len(r.batch))
	}
	r.cancel()
	bc.c.finish(r.batch, deferred, err)
}

// finish delivers the outcomes of batch's checks, parks the deferred ones,
// and releases its rows.
func (c *Coalescer) finish(batch []*pending, deferred []*engine.Request, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range batch {
		c.markInflight(p.rows, -1)
		switch {
		case slices.Contains(deferred, p.req):
			c.parkLocked(p)
			continue
		case err != nil:
			p.req.Err = engine.DBError("coalesced check", err)
		}
		p.decided()
	}
}

// formBatchesLocked takes batches off the queue while slots are free.
func (c *Coalescer) formBatchesLocked() [][]*pending {
	var out [][]*pending
	for len(c.queue) > 0 && c.mayOpen(c.queue[0].set.Dialect) {
		b := c.formLocked(nil)
		if len(b) == 0 {
			break
		}
		c.busy++
		out = append(out, b)
	}
	return out
}

// mayOpen says whether a batch of dialect d may start on a free slot now
// (see openAt): with none busy, with a batch's worth queued, or always where
// a batch holds one row (d's OneRowBatches: its batches cannot grow).
func (c *Coalescer) mayOpen(d engine.Dialect) bool {
	return c.busy < c.slots && (c.busy == 0 || len(c.queue) >= openAt || d.OneRowBatches())
}

// formLocked takes the next batch off the queue: checks in arrival order, of one
// group, none sharing a row with a batch in flight (but after, the batch it
// follows on one connection, see runChain) or with a check left queued
// before it. Checks of parked rows join their lanes.
func (c *Coalescer) formLocked(after []*pending) []*pending {
	var batch, keep []*pending
	held, mine := c.held, c.mine // mine: rows this batch's checks may share
	clear(held)
	clear(mine)
	for _, p := range after {
		for _, r := range p.rows {
			mine[r] = true
		}
	}
	for i, p := range c.queue {
		if len(batch) == maxBatch {
			keep = append(keep, c.queue[i:]...)
			break
		}
		switch {
		case slices.ContainsFunc(p.rows, func(r engine.Row) bool { return held[r] }):
		case c.anyParked(p.rows):
			c.parkLocked(p)
			continue
		case !slices.ContainsFunc(p.rows, func(r engine.Row) bool { return c.inflight[r] > 0 && !mine[r] }) &&
			(len(batch) == 0 || p.set == batch[0].set && (!p.set.Dialect.OneRowBatches() || slices.Equal(p.rows, batch[0].rows))):
			if batch == nil {
				batch = make([]*pending, 0, min(len(c.queue)-i, maxBatch))
			}
			batch = append(batch, p)
			for _, r := range p.rows {
				mine[r] = true
			}
			continue
		}
		for _, r := range p.rows {
			held[r] = true
		}
		keep = append(keep, p)
	}
	clear(c.queue)
	c.queue = append(c.queue[:0], keep...)
	for _, p := range batch {
		c.markInflight(p.rows, 1)
	}
	return batch
}

// parkLocked puts p in a lane behind the lanes of its rows: it joins the
// last one if that has not started and is for p's one row, else a new lane
// starts.
func (c *Coalescer) parkLocked(p *pending) {
	var deps []*lane
	for _, r := range p.rows {
		if ln := c.parked[r]; ln != nil && !slices.Contains(deps, ln) {
			deps = append(deps, ln)
		}
	}
	if len(deps) == 1 && !deps[0].started && len(p.rows) == 1 && len(deps[0].rows) == 1 && deps[0].reqs[0].set == p.set {
		deps[0].reqs = append(deps[0].reqs, p)
		return
	}
	ln := &lane{reqs: []*pending{p}, rows: p.rows, deps: deps, done: make(chan struct{})}
	for _, r := range p.rows {
		c.parked[r] = ln
	}
	c.goroutines.Go(func() { c.runLane(ln) })
}

// runLane waits for the lanes before ln, then runs its checks in one
// transaction that waits for their rows' locks.
func (c *Coalescer) runLane(ln *lane) {
	for _, d := range ln.deps {
		<-d.done
	}
	c.lanes <- struct{}{}
	c.mu.Lock()
	ln.started = true
	batch := ln.reqs
	c.mu.Unlock()

	ctx, cancel := batchContext(batch)
	_, err := engine.RunOwn(ctx, c.pool, engine.NewPlan(requests(batch), batch[0].set, true, engine.WaitLocks))
	if seen := batch[0].seen; seen != nil {
		seen(ctx, len(batch))
	}
	cancel()
	<-c.lanes

	c.mu.Lock()
	for _, r := range ln.rows {
		if c.parked[r] == ln {
			delete(c.parked, r)
		}
	}
	c.mu.Unlock()
	for _, p := range batch {
		if err != nil {
			p.req.Err = engine.DBError("check", err)
		}
		p.decided()
	}
	close(ln.done)
}

// requests returns the requests of batch's checks.
func requests(batch []*pending) []*engine.Request {
	reqs := make([]*engine.Request, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	return reqs
}

// batchContext is the context a transaction of several checks runs in: it
// ends when every member's context has ended (the others still want their
// answers until then). When every member has a deadline that is the latest
// of them, plus a moment so that callers see their own context end first;
// otherwise it follows the members' contexts.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		dl, ok := p.req.Ctx.Deadline()
		if !ok {
			ctxs := make([]context.Context, len(batch))
			for i, p := range batch {
				ctxs[i] = p.req.Ctx
			}
			return engine.FollowAll(ctxs...)
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.Background(), latest.Add(deadlineGrace))
}

// deadlineGrace is how long a transaction of checks outlives the latest of
// its members' deadlines.
const deadlineGrace = 50 * time.Millisecond

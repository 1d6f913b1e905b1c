package pgratelimit

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Coalescing: checks that arrive through the limiters of one pool while its
// transactions are busy wait in a queue and are then decided together, in
// arrival order, in one engine transaction (see engine.go). A check that finds
// a free slot and nobody queued runs at once, alone. There is no timer and no
// goroutine while the pool is idle.
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
// Under load a slot chains its batches (see runChain): once a batch is
// decided, if it deferred no check and a batch as big waits in the queue,
// that one follows on the same connection, its first statements in the same
// round trip as the previous batch's last ones. It may share rows with that
// batch, which commits first.

const (
	defaultCoalesceConns = 2
	maxBatch             = 256
	// queueFactor bounds the queue at this many full batches per slot;
	// beyond it checks run alone, waiting for their rows' locks, as they
	// would without coalescing.
	queueFactor = 4
)

// group is what the checks of one transaction must share: the clock and the
// transaction settings of their limiters.
type group struct {
	clock       *Limiter // whose Config.Clock; nil: the database's
	lockTimeout time.Duration
	async       bool
}

type pending struct {
	req  *request
	lim  *Limiter // the first charge's: pool, clock, settings
	grp  group
	rows []row
	done chan struct{}
}

// lane is one transaction of parked checks, run when the lanes before it on
// its rows (deps) are done.
type lane struct {
	reqs    []*pending
	rows    []row
	deps    []*lane
	started bool // guarded by coalescer.mu; no more checks join it
	done    chan struct{}
}

type coalescer struct {
	mu       sync.Mutex
	slots    int // batches in flight at most
	busy     int // batches in flight
	queue    []*pending
	inflight map[row]int   // rows of the batches in flight
	parked   map[row]*lane // each row's last lane
	lanes    chan struct{} // lane transactions in flight, at most cap(lanes)
	// oneRow makes every batch the checks of one row (Citus: a
	// transaction over several shards would need two-phase commit).
	oneRow bool
}

// newCoalescer returns a coalescer that runs up to slots batches at once on
// a pool of maxConns connections.
func newCoalescer(slots, maxConns int) *coalescer {
	return &coalescer{
		slots:    slots,
		inflight: make(map[row]int),
		parked:   make(map[row]*lane),
		// Lanes wait for row locks on connections of their own: leave the
		// batches theirs.
		lanes: make(chan struct{}, max(maxConns-slots, 1)),
	}
}

// atLeast makes c run at least slots batches at once.
func (c *coalescer) atLeast(slots int) {
	c.mu.Lock()
	c.slots = max(c.slots, slots)
	c.mu.Unlock()
}

// do runs q through the coalescer and returns its outcome, or ctx's error as
// soon as q's context ends.
func (c *coalescer) do(q *request, lim *Limiter) (MultiResult, error) {
	p := &pending{req: q, lim: lim, grp: lim.group(), rows: q.rows(), done: make(chan struct{})}
	c.mu.Lock()
	switch {
	case len(c.queue) > 0:
		if len(c.queue) >= c.slots*maxBatch*queueFactor {
			c.mu.Unlock()
			return runAlone(p)
		}
		c.queue = append(c.queue, p)
		// The queue may hold only checks whose rows are in a batch in
		// flight: with a slot free, p need not wait for that batch.
		var next [][]*pending
		if c.busy < c.slots && !c.anyInflight(p.rows) {
			next = c.formBatches()
		}
		c.mu.Unlock()
		for _, b := range next {
			go c.work(b)
		}
	case c.anyParked(p.rows):
		c.park(p)
		c.mu.Unlock()
	case c.busy < c.slots && !c.anyInflight(p.rows):
		// A free slot and nobody waiting: a batch of one, at once, on this
		// goroutine.
		c.busy++
		c.markInflight(p.rows, 1)
		c.mu.Unlock()
		for _, b := range c.runBatch([]*pending{p}, false) {
			go c.work(b)
		}
	default:
		c.queue = append(c.queue, p)
		c.mu.Unlock()
	}
	select {
	case <-p.done:
		if q.err != nil && q.ctx.Err() != nil {
			return MultiResult{}, q.ctx.Err() // the caller's own deadline, not the batch's
		}
		return q.out, q.err
	case <-q.ctx.Done():
		c.mu.Lock()
		c.queue = slices.DeleteFunc(c.queue, func(o *pending) bool { return o == p })
		c.mu.Unlock()
		// Queued: nothing was spent. In a batch or a lane: the engine skips
		// checks whose context ended before it decided, so at worst tokens
		// are spent without being reported, never reported without being
		// spent.
		return MultiResult{}, q.ctx.Err()
	}
}

// runAlone runs p in a transaction of its own that waits for its rows.
func runAlone(p *pending) (MultiResult, error) {
	_, err := runOwn(p.req.ctx, p.lim.pool, p.lim.run(p.req.ctx, []*request{p.req}, false))
	if err != nil {
		return MultiResult{}, dbError("check", err)
	}
	return p.req.out, ctxErrIfUndecided(p.req)
}

func (c *coalescer) anyParked(rows []row) bool {
	return slices.ContainsFunc(rows, func(r row) bool { return c.parked[r] != nil })
}

func (c *coalescer) anyInflight(rows []row) bool {
	return slices.ContainsFunc(rows, func(r row) bool { return c.inflight[r] > 0 })
}

func (c *coalescer) markInflight(rows []row, d int) {
	for _, r := range rows {
		if c.inflight[r] += d; c.inflight[r] == 0 {
			delete(c.inflight, r)
		}
	}
}

// work runs batch, then the batches that follow it while there are any; it
// starts goroutines only for batches beyond the first (a goroutine that runs
// batch after batch keeps the stack the engine needs).
func (c *coalescer) work(batch []*pending) {
	for batch != nil {
		next := c.runBatch(batch, true)
		batch = nil
		for i, b := range next {
			if i == 0 {
				batch = b
			} else {
				go c.work(b)
			}
		}
	}
}

// runBatch decides batch in one transaction that skips locked rows, delivers
// the decided checks' outcomes and parks the others. With chain, checks that
// queued meanwhile follow on its connection (see runChain), batch after
// batch, while each finds a full batch waiting. It returns the batches that
// may start once it is done.
func (c *coalescer) runBatch(batch []*pending, chain bool) [][]*pending {
	type running struct {
		batch  []*pending
		ctx    context.Context
		cancel context.CancelFunc
	}
	runs := make(map[*txRun]running, 2)
	start := func(batch []*pending) link {
		ctx, cancel := batchContext(batch)
		t := batch[0].lim.run(ctx, requests(batch), true)
		runs[t] = running{batch, ctx, cancel}
		return link{ctx, t}
	}
	next := func(after *txRun, deferred []*request) (link, bool) {
		// Not after a batch that deferred checks: they are parked once it
		// ends, and later checks of their rows must queue behind them.
		if !chain || len(deferred) > 0 {
			return link{}, false
		}
		c.mu.Lock()
		var b []*pending
		// Only when a batch as big as this one waits: else the checks
		// queued so far are better off in a bigger batch later.
		if len(c.queue) >= len(runs[after].batch) {
			b = c.form(runs[after].batch)
		}
		c.mu.Unlock()
		if len(b) == 0 {
			return link{}, false
		}
		return start(b), true
	}
	runChain(batch[0].lim.pool, start(batch), next, func(t *txRun, deferred []*request, err error) {
		r := runs[t]
		delete(runs, t)
		r.batch[0].lim.metrics.batchSize(r.ctx, len(r.batch))
		r.cancel()
		c.finish(r.batch, deferred, err)
	})

	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	return c.formBatches()
}

// finish delivers the outcomes of batch's checks, parks the deferred ones,
// and releases its rows.
func (c *coalescer) finish(batch []*pending, deferred []*request, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range batch {
		c.markInflight(p.rows, -1)
		switch {
		case slices.Contains(deferred, p.req):
			c.park(p)
			continue
		case err != nil:
			p.req.err = dbError("coalesced check", err)
		}
		close(p.done)
	}
}

// formBatches takes batches off the queue while slots are free.
func (c *coalescer) formBatches() [][]*pending {
	var out [][]*pending
	for c.busy < c.slots && len(c.queue) > 0 {
		b := c.form(nil)
		if len(b) == 0 {
			break
		}
		c.busy++
		out = append(out, b)
	}
	return out
}

// form takes the next batch off the queue: checks in arrival order, of one
// group, none sharing a row with a batch in flight (but after, the batch it
// follows on one connection, see runChain) or with a check left queued
// before it. Checks of parked rows join their lanes.
func (c *coalescer) form(after []*pending) []*pending {
	var batch, keep []*pending
	held := make(map[row]bool)
	mine := make(map[row]bool) // rows this batch's checks may share
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
		case slices.ContainsFunc(p.rows, func(r row) bool { return held[r] }):
		case c.anyParked(p.rows):
			c.park(p)
			continue
		case !slices.ContainsFunc(p.rows, func(r row) bool { return c.inflight[r] > 0 && !mine[r] }) &&
			(len(batch) == 0 || p.grp == batch[0].grp && (!c.oneRow || slices.Equal(p.rows, batch[0].rows))):
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

// park puts p in a lane behind the lanes of its rows: it joins the last one
// if that has not started and is for p's one row, else a new lane starts.
func (c *coalescer) park(p *pending) {
	var deps []*lane
	for _, r := range p.rows {
		if ln := c.parked[r]; ln != nil && !slices.Contains(deps, ln) {
			deps = append(deps, ln)
		}
	}
	if len(deps) == 1 && !deps[0].started && len(p.rows) == 1 && len(deps[0].rows) == 1 && deps[0].reqs[0].grp == p.grp {
		deps[0].reqs = append(deps[0].reqs, p)
		return
	}
	ln := &lane{reqs: []*pending{p}, rows: p.rows, deps: deps, done: make(chan struct{})}
	for _, r := range p.rows {
		c.parked[r] = ln
	}
	go c.runLane(ln)
}

// runLane waits for the lanes before ln, then runs its checks in one
// transaction that waits for their rows' locks.
func (c *coalescer) runLane(ln *lane) {
	for _, d := range ln.deps {
		<-d.done
	}
	c.lanes <- struct{}{}
	c.mu.Lock()
	ln.started = true
	batch := ln.reqs
	c.mu.Unlock()

	_, err := runTogether(batch, false)
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
			p.req.err = dbError("check", err)
		}
		close(p.done)
	}
	close(ln.done)
}

// runTogether runs batch in one transaction of its own, with the first
// check's limiter's clock and settings, and records its size.
func runTogether(batch []*pending, skip bool) (deferred []*request, err error) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	lim := batch[0].lim
	deferred, err = runOwn(ctx, lim.pool, lim.run(ctx, requests(batch), skip))
	lim.metrics.batchSize(ctx, len(batch))
	return deferred, err
}

// requests returns the requests of batch's checks.
func requests(batch []*pending) []*request {
	reqs := make([]*request, len(batch))
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
		dl, ok := p.req.ctx.Deadline()
		if !ok {
			ctxs := make([]context.Context, len(batch))
			for i, p := range batch {
				ctxs[i] = p.req.ctx
			}
			return followAll(ctxs...)
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

package pgratelimit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Coalescing: when checks arrive through one Limiter faster than its
// transactions finish, the waiting checks are decided together in one
// transaction of the same shape as a single check:
//
//	BEGIN
//	INSERT ... SELECT unnest(sorted distinct keys) ON CONFLICT DO NOTHING
//	SELECT ... WHERE key = ANY(keys) ORDER BY key FOR UPDATE  -- and the clock
//	-- every check decided in Go, in arrival order
//	UPDATE ... FROM unnest(changed rows)
//	COMMIT
//
// Rows are locked in key order, so batches cannot deadlock each other. A
// batch forms only from checks that queued while other batches ran: there is
// no timer, and a check that finds a free slot runs alone on the per-check
// path at once. No goroutine runs while the limiter is idle: when a batch
// ends, its slot is handed to the first queued check, which starts the
// queue's head as the next batch on a goroutine of its own. Every caller
// waits for its own result or its own context, whichever comes first.

const (
	defaultMaxBatch = 256
	// queueFactor bounds the queue at this many full batches per slot;
	// beyond it checks take the per-check path (and wait for a connection as
	// they would without coalescing).
	queueFactor = 4
)

type pendingState int

const (
	queued  pendingState = iota // in c.queue
	leading                     // handed a slot; starts the next batch
	taken                       // in a batch
)

type pending struct {
	ctx   context.Context
	key   string
	cost  int64
	state pendingState // guarded by coalescer.mu
	lead  chan struct{}
	done  chan struct{}
	res   Result
	err   error
}

type coalescer struct {
	l        *Limiter
	maxSlots int // batches (and per-check transactions) in flight at most
	maxBatch int

	mu    sync.Mutex
	busy  int // slots in use
	queue []*pending
}

func newCoalescer(l *Limiter, maxSlots, maxBatch int) *coalescer {
	return &coalescer{l: l, maxSlots: max(maxSlots, 1), maxBatch: max(maxBatch, 2)}
}

// allowN is AllowN through the coalescer.
func (c *coalescer) allowN(ctx context.Context, key string, cost int64) (Result, error) {
	c.mu.Lock()
	if c.busy < c.maxSlots && len(c.queue) == 0 {
		// A free slot and nobody waiting: a batch of one, today's path.
		c.busy++
		c.mu.Unlock()
		res, err := c.l.allowOne(ctx, key, cost)
		c.release()
		return res, err
	}
	if len(c.queue) >= c.maxSlots*c.maxBatch*queueFactor {
		c.mu.Unlock()
		return c.l.allowOne(ctx, key, cost)
	}
	p := &pending{ctx: ctx, key: key, cost: cost, lead: make(chan struct{}), done: make(chan struct{})}
	c.queue = append(c.queue, p)
	c.mu.Unlock()

	lead := p.lead
	for {
		select {
		case <-lead:
			c.lead(p)
			lead = nil // keep waiting for the result
		case <-p.done:
			return p.res, p.err
		case <-ctx.Done():
			c.mu.Lock()
			state := p.state
			if state == queued {
				c.queue = slices.DeleteFunc(c.queue, func(q *pending) bool { return q == p })
			}
			c.mu.Unlock()
			if state == leading {
				c.lead(p) // handed a slot: start the batch for the others
			}
			// Queued: nothing was spent. In a batch: it skips checks whose
			// context ended before it decided, so at worst tokens are spent
			// without being reported, never reported without being spent.
			return Result{}, ctx.Err()
		}
	}
}

// release frees a slot, or hands it to the first queued check.
func (c *coalescer) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.busy--
		return
	}
	next := c.queue[0]
	c.queue = c.queue[1:]
	next.state = leading
	close(next.lead)
}

// lead starts the batch that p heads (p plus the queue's head) on a
// goroutine of its own, which hands the slot on when it ends; the members,
// p among them, wait for their results or their contexts.
func (c *coalescer) lead(p *pending) {
	c.mu.Lock()
	p.state = taken
	n := min(len(c.queue), c.maxBatch-1)
	batch := make([]*pending, 0, n+1)
	batch = append(batch, p)
	for _, q := range c.queue[:n] {
		q.state = taken
		batch = append(batch, q)
	}
	c.queue = slices.Delete(c.queue, 0, n)
	c.mu.Unlock()

	go func() {
		if len(batch) == 1 {
			p.res, p.err = c.l.allowOne(p.ctx, p.key, p.cost)
			close(p.done)
		} else {
			c.l.runBatch(batch)
		}
		c.release()
	}()
}

// batchContext is the context a batch runs in: it is not cancelled when one
// member's context is (the others still want their answers), and it has the
// latest of the members' deadlines if they all have one.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		dl, ok := p.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// runBatch decides batch (two or more checks) in one transaction and
// delivers every member's result.
func (l *Limiter) runBatch(batch []*pending) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var err error
	for try := 1; try <= maxVanishTries; try++ {
		// After rows vanished twice, lock them with the upsert, which
		// always returns every row: still in key order, but it writes a
		// row version for each key, so it is only the last resort.
		upsert := try == maxVanishTries
		_, err = l.inOwnTx(ctx, "coalesced check", func(ctx context.Context, q querier) (Result, error) {
			return Result{}, l.batchTx(ctx, q, batch, upsert)
		})
		if !errors.Is(err, errVanished) {
			break
		}
		l.log.DebugContext(ctx, "pgratelimit: bucket rows deleted concurrently, retrying the batch", "prefix", l.cfg.Prefix, "try", try)
	}
	for _, p := range batch {
		if err != nil && p.err == nil {
			p.res, p.err = Result{}, err
		}
		close(p.done)
	}
}

// errVanished means rows of a batch were deleted between its INSERT and its
// SELECT. The batch rolls back and runs again: inserting them again inside
// the transaction would lock them out of key order (a deadlock risk).
var errVanished = errors.New("pgratelimit: bucket rows deleted concurrently")

// maxVanishTries bounds the runs of a batch whose rows vanish.
const maxVanishTries = 3

// batchTx runs a batch's transaction on q and sets each member's res (or
// err, for members whose context ended before the decision).
func (l *Limiter) batchTx(ctx context.Context, q querier, batch []*pending, upsert bool) error {
	now := l.now()
	keys := make([]string, 0, len(batch))
	first := map[string]int64{} // each key's first cost, for the new row's expiry
	for _, p := range batch {
		if _, ok := first[p.key]; !ok {
			first[p.key] = p.cost
			keys = append(keys, p.key)
		}
	}
	slices.Sort(keys) // byte order, as the tables' COLLATE "C"
	horizons := make([]time.Duration, len(keys))
	for i, k := range keys {
		horizons[i] = l.p.untilTokens(bucket{tokens: l.p.capacity - first[k]}, time.Time{}, l.p.capacity)
	}

	rows := make(map[string]bucket, len(keys))
	// Each row comes with the clock read after it was locked; rows are
	// locked in order, so the last one read is after every lock is held.
	var dbNow time.Time
	scan := func(r pgx.Rows) error {
		for r.Next() {
			var k string
			var b bucket
			if err := r.Scan(&k, &b.tokens, &b.refilledAt, &b.expiresAt, &dbNow); err != nil {
				return err
			}
			rows[k] = b
		}
		return r.Err()
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// Plan each batch's statements for its own arrays: measured 2-3x
	// faster than the generic plans a connection caches (built while the
	// table was small, and costed for arrays of unknown size).
	b.Queue("SET LOCAL plan_cache_mode = force_custom_plan")
	l.queueSettings(b)
	if upsert {
		b.Queue(l.sql.relockMany, l.cfg.Prefix, keys, l.p.capacity, now, horizons).Query(scan)
	} else {
		b.Queue(l.sql.insertMany, l.cfg.Prefix, keys, l.p.capacity, now, horizons)
		b.Queue(l.sql.lockMany, l.cfg.Prefix, keys, now).Query(scan)
	}
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if len(rows) < len(keys) {
		return errVanished
	}

	// Decide in arrival order, each key's state carried from check to check.
	state := make(map[string]bucket, len(keys))
	for k, b := range rows {
		state[k] = l.p.load(b, dbNow)
	}
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.err = err // gave up before the decision: nothing spent
			continue
		}
		p.res = Result{}
		state[p.key], p.res = l.p.take(state[p.key], dbNow, p.cost)
	}
	var (
		uKeys          []string
		uTokens        []int64
		uRefill, uExps []time.Time
	)
	for _, k := range keys {
		if nb := state[k]; !nb.same(l.p.load(rows[k], dbNow)) {
			uKeys = append(uKeys, k)
			uTokens = append(uTokens, nb.tokens)
			uRefill = append(uRefill, nb.refilledAt)
			uExps = append(uExps, nb.expiresAt)
		}
	}
	b = &pgx.Batch{}
	if len(uKeys) > 0 {
		b.Queue(l.sql.updateMany, l.cfg.Prefix, uKeys, uTokens, uRefill, uExps)
	}
	b.Queue("COMMIT")
	return q.SendBatch(ctx, b).Close()
}

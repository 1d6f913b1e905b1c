package pgratelimit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/lease"
	"go.opentelemetry.io/otel/metric"
)

// SemaphoreConfig is a Semaphore's limit: live leases hold at most Max units
// of a key, each lease counting until it is released or until TTL passes
// without an Extend. The zero value is not valid: Prefix, Max and TTL are
// required.
type SemaphoreConfig struct {
	// Prefix is the namespace of the semaphore's keys. Semaphores with the
	// same Prefix and Storage share their keys' leases. A key's leases are
	// kept in its row of the bucket table: a Limiter must not have the
	// same Prefix and Storage. An operation of the semaphore on a key
	// whose row holds a limiter's bucket is ErrInvalidConfig; a limiter's
	// check on a key with leases would move the row's expiry, so that
	// cleanup could delete the leases with it.
	// Required: non-empty, valid UTF-8, no NUL, at most 256
	// bytes.
	Prefix string

	// Max is the most units a key's live leases hold: the number of
	// leases, when each has weight 1. Must be > 0.
	Max int64

	// TTL is how long a lease counts after it is acquired or extended: a
	// holder that crashes (or stops extending) loses its units when it
	// passes, with no cleanup needed. Holders of work longer than TTL call
	// Extend (a heartbeat, every TTL/3 say). Must be > 0 and a whole
	// number of microseconds.
	TTL time.Duration

	// Storage chooses the durable (logged) or ephemeral (UNLOGGED) table
	// of the leases. Ephemeral writes are cheaper, but a crash of the
	// database forgets every lease (see README, Concurrency leases).
	// Defaults to Durable.
	Storage Storage

	// Clock, when set, replaces the database's clock: every operation
	// judges and stamps leases with Clock(). For tests and simulations.
	// Defaults to nil: the database's clock_timestamp(), read after the
	// key's row lock is held.
	Clock func() time.Time

	// MaxWait bounds how long Wait may wait in all: past it Wait returns
	// ErrWaitTooLong. Defaults to 0: only the context bounds it.
	MaxWait time.Duration

	// DisableCoalescing makes every operation a transaction of its own.
	// By default the semaphore's operations are coalesced with the other
	// checks of its Client, as a Limiter's (Config.DisableCoalescing).
	// Defaults to false: coalescing on.
	DisableCoalescing bool

	// MeterProvider receives the semaphore's OpenTelemetry metrics:
	// pgratelimit.leases.held and pgratelimit.leases.denied. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

func (c SemaphoreConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return configError("SemaphoreConfig."+field, format, args...)
	}
	switch why := checkText(c.Prefix, maxPrefixLen); {
	case why != "":
		return bad("Prefix", "%s", why)
	case c.Max <= 0:
		return bad("Max", "must be > 0, got %d", c.Max)
	case c.TTL <= 0 || c.TTL%time.Microsecond != 0:
		return bad("TTL", "must be > 0 and a whole number of microseconds, got %s", c.TTL)
	case c.Storage != Durable && c.Storage != Ephemeral:
		return bad("Storage", "must be Durable or Ephemeral, got %d", int(c.Storage))
	case c.MaxWait < 0:
		return bad("MaxWait", "must be >= 0, got %s", c.MaxWait)
	}
	return nil
}

// Lease is a lease held on a key: Weight units of its Semaphore's Max until
// ExpiresAt, unless released or extended before.
type Lease struct {
	// ID names the lease for Release and Extend: the request ID of the
	// acquisition (WithRequestID), else a random one.
	ID string
	// Key is the key it holds units of.
	Key string
	// Weight is the units it holds.
	Weight int64
	// Token is its fencing token: it grows with every acquisition, so a
	// holder that writes to another system can send it along, and that
	// system can refuse writes carrying a token older than the newest it
	// has seen (a holder that paused past its TTL).
	Token int64
	// AcquiredAt is when it was acquired, ExpiresAt when it stops counting
	// unless extended, by the check's clock, in UTC.
	AcquiredAt, ExpiresAt time.Time
}

// LeaseResult is the outcome of an acquisition: a Result, as a limiter's
// check has it, and the lease. Allowed says the lease was acquired (when
// not, nothing was written); Limit is the semaphore's Max and Remaining the
// units the key's live leases leave free, this one counted (Limit minus
// Remaining is what they hold); RetryAfter is, when not acquired, how long
// until enough of the live leases expire for this weight, if none is
// released or extended before (releases usually come sooner); ResetAfter
// is how long until every live lease of the key has expired; Replayed says
// the acquisition is a replay: its request ID (WithRequestID) named a live
// lease of the key, which Lease is, and nothing was taken or written now.
// Granted and FromGrants are 0.
type LeaseResult struct {
	Result
	// Lease is the lease acquired (or, for a retry of an acquisition with
	// the same request ID, the one it acquired then); zero when not
	// acquired.
	Lease Lease
}

// Semaphore limits how much of something runs at once per key: a key has
// Max units, and an acquisition takes a lease of some of them (its weight,
// 1 for "one of N slots") if the key's live leases leave that many free.
// A lease counts until it is released, or until its TTL passes without an
// Extend, by the database's clock: a holder that crashes loses its units at
// the TTL by itself, with no cleanup job needed.
//
// Every operation is one transaction that locks the key's row (as a
// Limiter's check does), so no order of concurrent acquisitions, in any
// number of processes, lets the live leases of a key hold more than Max.
// Being denied is a LeaseResult with Acquired == false, never an error.
//
// Use Acquire to try, Wait to wait for a slot, Extend as a heartbeat,
// Release when done, Leases to list a key's live leases, In to run in your
// transaction, and a Charge with a Semaphore to take a lease together with
// rate limits and quotas in AllowAll. A Semaphore is safe for concurrent
// use.
type Semaphore struct {
	client  *Client
	cfg     SemaphoreConfig
	limit   lease.Limit
	clock   *engine.Clock // nil: the database's
	tx      *Tx           // the caller's transaction (In); nil: its own
	metrics *leaseInstruments
	wake    *waker
	rows    *knownRows // shared with its In copies
	// parts are the lease.Part of each lease.Kind under limit, made once
	// (a Part in a Charge's interface allocates at each use).
	parts [lease.Extend + 1]engine.Part
}

// NewSemaphore returns a Semaphore for cfg that keeps its leases in the
// database of pool, on a Client of its own (as New does for a Limiter). It
// validates cfg (ErrInvalidConfig names the bad field) and does not touch
// the database.
func NewSemaphore(pool *pgxpool.Pool, cfg SemaphoreConfig) (*Semaphore, error) {
	if pool == nil {
		return nil, configError("pool", "is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newSemaphore(newClient(pool, defaultCoalesceConns), cfg)
}

// NewSemaphore returns a Semaphore for cfg whose operations go through c,
// coalesced with its limiters' checks. It validates cfg and does not touch
// the database.
func (c *Client) NewSemaphore(cfg SemaphoreConfig) (*Semaphore, error) {
	return newSemaphore(c, cfg)
}

func newSemaphore(c *Client, cfg SemaphoreConfig) (*Semaphore, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if c.mem != nil {
		return nil, configError("SemaphoreConfig", "needs a database: a Client of NewMemoryClient has none")
	}
	s := &Semaphore{client: c, cfg: cfg, limit: lease.Limit{Max: cfg.Max, TTL: cfg.TTL},
		metrics: newLeaseInstruments(cfg.MeterProvider, cfg.Prefix), rows: &knownRows{}}
	for _, k := range []lease.Kind{lease.Acquire, lease.Release, lease.Extend} {
		s.parts[k] = lease.Part{Kind: k, Limit: s.limit}
	}
	if cfg.Clock != nil {
		s.clock = &engine.Clock{Now: cfg.Clock}
	}
	s.wake = newWaker(c.pool, cfg.Prefix)
	return s, nil
}

// Config returns the semaphore's configuration, as passed to NewSemaphore.
func (s *Semaphore) Config() SemaphoreConfig { return s.cfg }

// In returns s running every operation in tx, the caller's own
// transaction: Acquire, Release, Extend, Leases, and AllowAll when the
// first charge's Semaphore is s. A lease acquired there exists only if tx
// commits (and a release counts only then). The key's row stays locked
// until tx ends, so other operations on the key wait for it: keep such
// transactions short. Wait does not wait in a transaction (no release could
// come while it holds the lock): it is ErrInvalidConfig. Under REPEATABLE
// READ or SERIALIZABLE a concurrent acquisition on the same key makes one
// fail with a serialization error (SQLSTATE 40001). The returned semaphore
// costs a copy of s: make one per transaction.
func (s *Semaphore) In(tx Tx) *Semaphore {
	c := *s
	c.tx = &tx
	return &c
}

// Acquire takes a lease of weight units of key's Max if the key's live
// leases leave that many free; else it is denied (Acquired false, with
// Held and RetryAfter) and writes nothing. With a WithRequestID context the
// request ID is the lease's ID and the acquisition happens once: a retry
// while the lease is live (a lost reply, a timeout) returns the same lease,
// one after it has expired or been released acquires anew, and one with
// another weight is ErrRequestMismatch. Errors are invalid input
// (ErrInvalidKey; ErrInvalidCost for a weight below 1,
// ErrCostExceedsCapacity above Max; ErrInvalidRequestID), found before any
// database access, the context's, or the database's. A context that ends as
// the transaction commits returns its error though the lease was taken:
// with a request ID, retry Acquire with it (it returns that lease) and
// Release it if the work is off; without one, the lease holds its units
// until its TTL (see docs/leases.md, Errors and retries).
func (s *Semaphore) Acquire(ctx context.Context, key string, weight int64) (LeaseResult, error) {
	if err := s.validate(key, weight); err != nil {
		return LeaseResult{}, err
	}
	id, err := requestID(ctx)
	if err != nil {
		return LeaseResult{}, err
	}
	if id == "" {
		id = rand.Text()
	}
	op := s.request(ctx, id, lease.Acquire, key, weight)
	q, call := &op.q, &op.call
	if err := s.run(q, func() string { return "acquire a lease of " + quoteKey(key) }); err != nil {
		return LeaseResult{}, err
	}
	defer s.recycle(op)
	if !q.Charges[0].NoInsert { // else its row was known: nothing to note
		s.decided(key, call)
	}
	out, _ := call.Outcome(s.row(key))
	s.metrics.record(q.Ctx, key, q.Allowed, out)
	res := LeaseResult{Result: resultOf(q.Outcomes[0].Outcome)}
	res.Replayed = out.Replayed
	if q.Allowed {
		res.Lease = leaseOf(key, out.Lease)
	}
	return res, nil
}

// Release gives the units of lease id back: they are free at once, and
// Wait calls on the key are woken. Releasing a lease that is not held
// (released before, never acquired, or forgotten: expired more than one
// TTL ago) is nil; one whose TTL has passed less than one TTL ago is
// ErrLeaseExpired (its units were already free).
func (s *Semaphore) Release(ctx context.Context, key, id string) error {
	_, err := s.change(ctx, lease.Release, key, id, "release")
	return err
}

// Extend renews lease id for the semaphore's TTL from now (never moving its
// expiry earlier), and returns it: the heartbeat of a holder whose work may
// outlast the TTL. A lease whose TTL has already passed is
// ErrLeaseExpired, even if its units are still free: its holder must
// acquire again. One that is not held (released, never acquired, or
// forgotten: expired more than one TTL ago) is ErrLeaseNotFound.
func (s *Semaphore) Extend(ctx context.Context, key, id string) (Lease, error) {
	out, err := s.change(ctx, lease.Extend, key, id, "extend")
	if err != nil {
		return Lease{}, err
	}
	return leaseOf(key, out.Lease), nil
}

// change releases or extends lease id of key.
func (s *Semaphore) change(ctx context.Context, kind lease.Kind, key, id, verb string) (lease.Outcome, error) {
	if err := validateKey(key); err != nil {
		return lease.Outcome{}, err
	}
	if why := checkText(id, maxRequestIDLen); why != "" {
		return lease.Outcome{}, badArg(ErrInvalidRequestID, "%s", why)
	}
	op := s.request(ctx, id, kind, key, 1)
	q, call := &op.q, &op.call
	err := s.run(q, func() string { return verb + " lease " + strconv.Quote(id) + " of " + quoteKey(key) })
	if err == nil {
		defer s.recycle(op)
	}
	decided := errors.Is(err, lease.ErrExpired) || errors.Is(err, lease.ErrNotFound)
	var out lease.Outcome
	if err == nil || decided {
		// Else the call may have returned before its batch decided it
		// (its context ended): the batch may still be writing call.
		s.decided(key, call)
		out, _ = call.Outcome(s.row(key))
	}
	if kind == lease.Release && (err == nil || errors.Is(err, lease.ErrExpired)) {
		s.metrics.released(q.Ctx, key, id)
	}
	if decided {
		return out, fmt.Errorf("%w: lease %q of %s of prefix %q", err, id, quoteKey(key), s.cfg.Prefix)
	}
	return out, err
}

// Leases returns key's live leases, by the check's clock, oldest first. It
// locks and writes nothing.
func (s *Semaphore) Leases(ctx context.Context, key string) ([]Lease, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	var (
		ls  []lease.Lease
		now time.Time
	)
	if err := s.client.read(ctx, s.tx, "list the leases of "+quoteKey(key), lease.ReadList(s.row(key), s.clock.Param(), &ls, &now)); err != nil {
		return nil, err
	}
	live := lease.Live(ls, now)
	slices.SortStableFunc(live, func(a, b lease.Lease) int { return a.AcquiredAt.Compare(b.AcquiredAt) })
	var out []Lease
	for _, l := range live {
		out = append(out, leaseOf(key, l))
	}
	return out, nil
}

// validate checks a key and a weight before any database access.
func (s *Semaphore) validate(key string, weight int64) error {
	if err := validateKey(key); err != nil {
		return err
	}
	switch {
	case weight < 1:
		return badArg(ErrInvalidCost, "weight %d is below 1", weight)
	case weight > s.cfg.Max:
		return badArg(ErrCostExceedsCapacity, "weight %d, Max %d", weight, s.cfg.Max)
	}
	return nil
}

func (s *Semaphore) storage() engine.Storage { return engine.Storage(s.cfg.Storage) }

// row is key's lock row.
func (s *Semaphore) row(key string) engine.Row {
	return engine.Row{Storage: s.storage(), Prefix: s.cfg.Prefix, Key: key}
}

// charge is an operation of kind on key, of weight. A coalesced batch
// inserts the key's row only for an acquisition on a key whose row s has
// not seen (knownRows): a key without a row has no lease to release or
// extend.
func (s *Semaphore) charge(kind lease.Kind, key string, weight int64) engine.Charge {
	return engine.Charge{Row: s.row(key), Cost: weight, Part: s.parts[kind],
		NoInsert: kind != lease.Acquire || s.rows.has(key)}
}

// decided notes that an operation of s on key was decided: the key's row
// exists.
func (s *Semaphore) decided(key string, call *lease.Call) {
	if _, ok := call.Outcome(s.row(key)); ok {
		s.rows.add(key)
	}
}

// request is a request of one operation of kind on key, with its call of
// lease id.
func (s *Semaphore) request(ctx context.Context, id string, kind lease.Kind, key string, weight int64) *leaseOp {
	op, _ := s.client.leaseOps.Get().(*leaseOp)
	if op == nil {
		op = new(leaseOp)
	}
	op.call.ID = id
	op.c[0] = s.charge(kind, key, weight)
	op.c[0].Call = &op.call
	op.q = engine.Request{Ctx: ctx, Kind: account.OpCharge, Charges: op.c[:]}
	return op
}

// leaseOp is a request of one lease operation, its charge and its call, in
// one allocation, recycled (Client.leaseOps) as a oneCharge is: once its
// operation has returned without an error.
type leaseOp struct {
	oneCharge
	call lease.Call
}

// recycle puts op, of s, back in its client's leaseOps; op is not used
// after.
func (s *Semaphore) recycle(op *leaseOp) {
	*op = leaseOp{}
	s.client.leaseOps.Put(op)
}

// settings are what a transaction of s's operations shares with others.
func (s *Semaphore) settings() engine.Settings { return engine.Settings{Clock: s.clock} }

// leaseOf is the Lease of l, of key, its times in UTC (whether they come
// from the database or from Go).
func leaseOf(key string, l lease.Lease) Lease {
	return Lease{ID: l.ID, Key: key, Weight: l.Weight, Token: l.Token, AcquiredAt: l.AcquiredAt.UTC(), ExpiresAt: l.ExpiresAt.UTC()}
}

// run runs q as s's operation: in s's transaction (In), else in one of the
// client's, coalesced unless disabled. what names it in errors (made only
// when they can say it: a coalesced batch's errors name no call).
func (s *Semaphore) run(q *engine.Request, what func() string) error {
	set := s.settings()
	switch {
	case s.tx != nil:
		return s.client.runIn(q.Ctx, s.tx, q, set, what())
	case s.cfg.DisableCoalescing:
		return s.client.run(q, set, nil, false, what())
	}
	return s.client.run(q, set, nil, true, "")
}

// maxKnownRows bounds the keys a semaphore remembers (knownRows): past it,
// it starts again from none.
const maxKnownRows = 1 << 16

// knownRows are keys whose row a semaphore has seen (an operation of its
// own locked it), so that its coalesced acquisitions of them skip the
// INSERT of the row (engine.Charge.NoInsert), which costs a batch as much
// as the lock. It is only ever a matter of speed: a key whose row cleanup
// has deleted since (its leases all forgotten) is deferred by its batch and
// runs again with the INSERT.
//
// A map behind a read lock, not a sync.Map: with thousands of keys, the
// sync.Map's lookups cost a lease pair's client a microsecond (issue #44).
type knownRows struct {
	mu   sync.RWMutex
	keys map[string]struct{}
}

func (k *knownRows) has(key string) bool {
	k.mu.RLock()
	_, ok := k.keys[key]
	k.mu.RUnlock()
	return ok
}

func (k *knownRows) add(key string) {
	if k.has(key) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil || len(k.keys) >= maxKnownRows {
		k.keys = make(map[string]struct{})
	}
	k.keys[key] = struct{}{}
}

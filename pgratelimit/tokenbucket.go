package pgratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/alert"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"go.opentelemetry.io/otel/metric"
)

// Storage chooses the table a Limiter keeps its buckets in.
type Storage int

const (
	// Durable keeps buckets in a logged table: they survive crashes and
	// failover and are on standbys. Right for credits and quotas.
	Durable Storage = iota
	// Ephemeral keeps buckets in an UNLOGGED table: cheaper writes, but
	// PostgreSQL empties it after a crash (every bucket is full again) and it
	// is not replicated. Right for request-rate limits.
	Ephemeral
)

// String returns "durable" or "ephemeral".
func (s Storage) String() string {
	switch s {
	case Durable:
		return "durable"
	case Ephemeral:
		return "ephemeral"
	}
	return fmt.Sprintf("Storage(%d)", int(s))
}

func (s Storage) statements() *sqlgen.Statements { return engine.Storage(s).Statements() }

// Config is a Limiter's policy: a token bucket of Capacity tokens per key that
// gains Refill tokens every Interval. The zero value is not valid: Prefix,
// Capacity, Refill and Interval are required.
type Config struct {
	// Prefix is the namespace of this limiter's keys, e.g. "api" or
	// "uploads". Limiters with different prefixes never share a bucket.
	// Limiters with the same prefix share their buckets (and grants), also
	// with different policies: that is how per-customer plans work (each
	// plan a limiter on one prefix; a bigger plan refills to its capacity, a
	// smaller one clamps). Limits that must not share buckets need prefixes
	// of their own. Required: non-empty, valid UTF-8, no NUL, at most
	// 256 bytes.
	Prefix string

	// Capacity is the most tokens a bucket holds: the burst. A new key starts
	// full. Must be > 0.
	Capacity int64

	// Refill is how many tokens a bucket gains every Interval, up to Capacity.
	// Must be > 0.
	Refill int64

	// Interval is the refill period: Refill tokens arrive at every whole
	// multiple of Interval since the Unix epoch (so the grid keeps its
	// phase whatever happens to a bucket's row). Must be > 0 and a whole
	// number of microseconds (PostgreSQL's timestamp resolution), unless
	// Calendar is set.
	Interval time.Duration

	// Calendar, when set, makes the refills fall on calendar boundaries in
	// a time zone instead of every Interval (leave Interval 0): every day,
	// week or month, anchored for every key (Calendar.Anchor) or per key
	// (Limiter.WithAnchor, e.g. each customer's subscription start). Refill
	// == Capacity resets the quota at each boundary; a smaller Refill lets
	// unused tokens roll over up to Capacity. Defaults to the zero
	// Calendar: refills every Interval.
	Calendar Calendar

	// Storage chooses the durable (logged) or ephemeral (UNLOGGED) table.
	// Defaults to Durable.
	Storage Storage

	// Grants lets the limiter's checks spend credits granted to a key
	// beyond its bucket (Limiter.Grant): a check takes from the bucket
	// first, then from the key's live grants, soonest-expiring first, all
	// or nothing. A check may then cost more than Capacity: it is allowed
	// when the bucket and the grants together hold its cost. Grants belong
	// to a Prefix and key, like buckets. A key without grants costs no extra
	// round trip (its grants are read with its bucket's row). Needs Storage
	// Durable. Defaults to false: grants are neither read nor spent, and a
	// cost above Capacity is ErrCostExceedsCapacity.
	Grants bool

	// Clock, when set, replaces the database's clock: every check uses
	// Clock() as the current time. Meant for tests and simulations; in
	// production all instances should share the database's clock so that clock
	// skew cannot mint tokens. Defaults to nil: the database's
	// clock_timestamp(), read after the bucket's row lock is held.
	Clock func() time.Time

	// DisableCoalescing makes every AllowN (and every AllowAll that charges
	// this Limiter) a transaction of its own. By default, checks that arrive
	// through the limiters of one Client while others are in flight wait for a
	// slot and are then decided together in one transaction of the same
	// shape (same statements over their distinct rows, rows locked in one
	// order, decisions in arrival order), with the same results they would
	// get one by one. This multiplies throughput, most on hot keys, and adds
	// no latency when checks do not overlap. A coalesced transaction never
	// waits for a row that another transaction holds: the checks of that row
	// wait for it alone. A check in the caller's transaction (In) never
	// coalesces. Defaults to false: coalescing on.
	DisableCoalescing bool

	// LockTimeout bounds how long a check waits for its bucket's row lock
	// (SET LOCAL lock_timeout) when another transaction holds it: past it
	// the check fails with ErrLockTimeout, which is safe to retry, instead
	// of queueing behind a long transaction. It applies to the limiter's own
	// transactions, not to those of In (set lock_timeout in your transaction
	// for that). Must be a whole number of milliseconds. Defaults to 0: wait
	// as long as the context allows.
	LockTimeout time.Duration

	// AsyncCommit commits the limiter's own transactions asynchronously
	// (synchronous_commit off, for the transaction only: it works through
	// PgBouncer in transaction mode and on Citus): a check does not wait for
	// its commit to be flushed to disk or to a synchronous standby. Checks
	// get cheaper and faster, the table stays logged (it survives a restart
	// and is on the standbys, so a failover keeps the limits), but after a
	// crash of the server the last moments of checks (up to three times
	// wal_writer_delay, 600ms by default) are forgotten, as if refunded:
	// right for request rates, never for money. So a limiter with Grants or
	// Ledger refuses it (ErrInvalidConfig), and so does a call with a
	// request ID (WithRequestID) or Settle. A coalesced batch never mixes
	// the two modes; AllowAll commits asynchronously only if every charged
	// limiter does; in the caller's transaction (In) the caller's
	// setting stands. Defaults to false: synchronous, the only mode for
	// money.
	AsyncCommit bool

	// DenyCacheSize turns on the deny cache and bounds it: once a key has
	// been denied a cost with RetryAfter r, AllowN, Allow, WaitN and Wait
	// checks of that key with at least that cost are denied by this process
	// without a transaction (Result.RetryAfter counting down) until r has
	// passed, for up to DenyCacheSize keys (beyond it, expired entries and
	// then arbitrary ones make room; no goroutine per entry). An abusive
	// client hammering one key then costs the database nothing until its
	// retry time. What can differ from the database's answer: a refund,
	// reset or grant made by another process (or another Client) is not
	// seen until r has passed; this process's own, through any limiter of
	// the same Client and Prefix, clear the entry. Leave it off for credits
	// and quotas whose grants or refunds come from elsewhere. AllowAll and
	// the Tx variants always ask the database. Defaults to 0: off.
	DenyCacheSize int

	// Ledger appends a row to pgratelimit_ledger for every allowed charge,
	// refund, grant, settlement, debit and reset of this limiter, in the
	// same transaction: the database's time, prefix, key, the amount the
	// balance gained (negative: spent), the kind, the request ID and the
	// balance afterwards (tokens plus live grants). Denied checks write
	// nothing. Needs Storage Durable. Defaults to false.
	Ledger bool

	// RequestIDRetention is how long the database remembers a request ID
	// (WithRequestID) after its check: a retry within it returns the first
	// outcome and charges nothing; after it, cleanup forgets the ID and a
	// retry is charged again. Defaults to 24 hours.
	RequestIDRetention time.Duration

	// MaxWait bounds how long Wait and WaitN may block in all; a wait that
	// would take longer returns ErrWaitTooLong at once. Defaults to 0: only
	// the context's deadline bounds it.
	MaxWait time.Duration

	// Alerts are usage alerts: events written in the transaction of the
	// charge that crosses a line (80% of the quota used, the balance at or
	// below 100, a denial once it is spent), once per key and period, for a
	// Consumer to deliver (see Alerts, and package events). Needs Storage Durable. A
	// charge that crosses no line costs a few comparisons in Go. Defaults
	// to none.
	Alerts Alerts

	// Overrides makes the limiter's checks read each key's override
	// (SetOverride), in the statement that locks the key's bucket row (no
	// extra round trip): while it lasts, it replaces Capacity and Refill
	// for that key, on every instance at once. Limiters on one Prefix share
	// the overrides of its keys, but only those with Overrides read them.
	// Defaults to false: the checks send the statements they sent before
	// overrides existed, and SetOverride and ClearOverride are
	// ErrInvalidArgument. See docs/overrides.md.
	Overrides bool

	// MeterProvider receives the limiter's OpenTelemetry metrics (see
	// README, Metrics): pgratelimit.checks, pgratelimit.check.duration and
	// pgratelimit.batch.size. Defaults to otel.GetMeterProvider(), which
	// records nothing until the application installs an SDK.
	MeterProvider metric.MeterProvider
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return configError("Config."+field, format, args...)
	}
	if why := checkText(c.Prefix, maxPrefixLen); why != "" {
		return bad("Prefix", "%s", why)
	}
	if c.Capacity <= 0 {
		return bad("Capacity", "must be > 0, got %d", c.Capacity)
	}
	if c.Refill <= 0 {
		return bad("Refill", "must be > 0, got %d", c.Refill)
	}
	switch {
	case c.Calendar != (Calendar{}) && c.Interval != 0:
		return bad("Interval", "and Calendar are both set (Interval %s, Calendar every %s): set one", c.Interval, c.Calendar.Every)
	case c.Calendar != (Calendar{}):
		if err := c.Calendar.validate(); err != nil {
			f, r, _ := strings.Cut(err.Error(), " ")
			return bad(f, "%s", r)
		}
	case c.Interval <= 0:
		return bad("Interval", "must be > 0, got %s", c.Interval)
	case c.Interval%time.Microsecond != 0:
		return bad("Interval", "must be a whole number of microseconds, got %s", c.Interval)
	}
	if c.LockTimeout < 0 || c.LockTimeout%time.Millisecond != 0 {
		return bad("LockTimeout", "must be >= 0 and a whole number of milliseconds, got %s", c.LockTimeout)
	}
	if c.MaxWait < 0 {
		return bad("MaxWait", "must be >= 0, got %s", c.MaxWait)
	}
	if c.DenyCacheSize < 0 {
		return bad("DenyCacheSize", "must be >= 0, got %d", c.DenyCacheSize)
	}
	if c.Storage != Durable && c.Storage != Ephemeral {
		return bad("Storage", "must be Durable or Ephemeral, got %d", int(c.Storage))
	}
	if c.Grants && c.Storage != Durable {
		return bad("Grants", "needs Storage Durable: grants are credits, kept in a logged table")
	}
	if c.Ledger && c.Storage != Durable {
		return bad("Ledger", "needs Storage Durable: a ledger of buckets an ephemeral table forgets would not add up")
	}
	if c.AsyncCommit && (c.Grants || c.Ledger) {
		return bad("AsyncCommit", "with Grants or Ledger: credits and their ledger must survive a crash (synchronous commit)")
	}
	if c.RequestIDRetention < 0 {
		return bad("RequestIDRetention", "must be >= 0, got %s", c.RequestIDRetention)
	}
	if why := c.Alerts.validate(c.Storage); why != "" {
		f, r, _ := strings.Cut(why, " ")
		return bad(f, "%s", r)
	}
	return nil
}

// Result is the outcome of a check.
type Result struct {
	// Allowed says whether the check took its tokens. A denied check takes
	// nothing and writes nothing.
	Allowed bool
	// Limit is the bucket's Capacity.
	Limit int64
	// Remaining is the number of tokens left after this check.
	Remaining int64
	// RetryAfter is, for a denied check, how long until enough whole refills
	// have happened for the same cost to be allowed, if nothing else takes
	// or gives tokens meanwhile: the key's grants count only while they
	// live (one that expires before then is counted out). Zero when
	// allowed; InfDuration when refills never can (a cost above Capacity
	// plus the grants still live by then).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Granted is the credits the key's live grants hold after this check,
	// beyond Remaining (limiters with Config.Grants; 0 otherwise).
	Granted int64
	// FromGrants is how much of this charge the key's live grants paid
	// (Config.Grants): the cost less what the bucket's tokens paid, for an
	// allowed check or a Debit. For a Settle it is the grants' part of the
	// settlement's difference: what the grants paid of a cost above the
	// estimate, or, negative, what went back to them of a cost below it.
	// A replay reports what the grants paid the first time (a Settle's
	// replay, what its settlement's difference did). 0 for a denial, a Refund, a Reset, a Peek, and on a
	// limiter without grants. In AllowAll, charges of one bucket are
	// decided as one, and each of their Results reports their sum's.
	FromGrants int64
	// Replayed says the Result is a replay: the call's request ID
	// (WithRequestID) had been seen on the key, so this is the first
	// call's Result, bit for bit, and nothing was taken, written or
	// changed now (for a Settle: the request was settled before at the
	// same actual cost). A denial is never recorded, so it is never
	// replayed; neither is a Peek.
	Replayed bool
}

// Limiter is a token-bucket rate limiter whose buckets live in PostgreSQL,
// one row per key. Each bucket holds at most Capacity tokens, starts full, and
// gains Refill tokens at every whole multiple of Interval since the Unix
// epoch (or at each boundary of a Calendar); a check of cost n takes n tokens
// if there are n, else it is denied and takes nothing.
//
// Every check is one transaction that locks the key's row, so checks are exact
// under any concurrency, across any number of processes sharing the database.
// The time is the database's (see Config.Clock).
//
// Use Allow or AllowN to check and spend, In to do anything inside your own
// transaction, AllowAll to charge several limits at once,
// Peek to look without spending, Refund to give tokens back and Reset to
// refill a bucket. A Limiter is safe for concurrent use.
type Limiter struct {
	client  *Client
	cfg     Config
	p       account.Policy
	clock   *engine.Clock // nil: the database's
	tx      *Tx           // the caller's transaction (In); nil: the limiter's own
	deny    *denyCache    // nil: off (Config.DenyCacheSize)
	metrics *instruments
	alerts  *alert.Observer // nil: no Config.Alerts
	note    *policyNote     // records the policy at the first operation
}

// New returns a Limiter for cfg that keeps its buckets in the database of
// pool: NewLimiter on a Client of the limiter's own, with the default
// ClientConfig, which learns the database's dialect at the first check and
// is never closed (see Client). It validates cfg (a *ConfigError names the
// bad field) and does not touch the database: a missing schema shows up as
// ErrNotMigrated on the first check.
func New(pool *pgxpool.Pool, cfg Config) (*Limiter, error) {
	if pool == nil {
		return nil, configError("pool", "is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newLimiter(newClient(pool, defaultCoalesceConns), cfg)
}

func newLimiter(c *Client, cfg Config) (*Limiter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if c.mem != nil && !cfg.Alerts.thresholds().Empty() {
		return nil, configError("Config.Alerts", "need a database: a limiter of NewMemoryClient writes no events")
	}
	if c.mem != nil && cfg.Overrides {
		return nil, configError("Config.Overrides", "need a database: a limiter of NewMemoryClient reads no overrides")
	}
	l := &Limiter{
		client:  c,
		cfg:     cfg,
		p:       cfg.policy(),
		metrics: newInstruments(cfg.MeterProvider, cfg.Prefix),
		alerts:  newAlertObserver(cfg),
		note:    newPolicyNote(cfg),
	}
	if cfg.Clock != nil {
		l.clock = &engine.Clock{Now: cfg.Clock}
	}
	if cfg.DenyCacheSize > 0 {
		l.deny = newDenyCache(cfg.DenyCacheSize)
		c.addDenyCache(cfg.Prefix, l.deny)
	}
	return l, nil
}

// policy is c's bucket policy: a grid of Interval, or c's Calendar with its
// own anchor.
func (c Config) policy() account.Policy {
	p := account.Policy{Capacity: c.Capacity, Refill: c.Refill, Grants: c.Grants, Ledger: c.Ledger,
		Retention: cmp.Or(c.RequestIDRetention, 24*time.Hour)}
	if c.Calendar != (Calendar{}) {
		p.Schedule = c.Calendar.at(time.Time{})
	} else {
		p.Schedule = account.Grid(c.Interval)
	}
	return p
}

// WithAnchor returns a limiter that checks key's bucket on the calendar
// anchored at anchor rather than at Config.Calendar.Anchor: each customer's
// quota renews on their own billing day (anchor: their subscription start,
// read in the Calendar's Location). It shares everything else with l (the
// client, the buckets, the settings) and costs a copy of the Limiter, so
// make one per check:
//
//	res, err := quota.WithAnchor(customer.SubscribedAt).AllowN(ctx, customer.ID, 1)
//
// Use the same anchor for a key every time: the bucket remembers the last
// boundary it was refilled at, not the anchor. On a limiter without a
// Calendar it returns l.
func (l *Limiter) WithAnchor(anchor time.Time) *Limiter {
	if l.cfg.Calendar == (Calendar{}) {
		return l
	}
	c := *l
	c.cfg.Calendar.Anchor = anchor
	c.p.Schedule = c.cfg.Calendar.at(anchor)
	return &c
}

// localNow is the process's time for the deny cache: Config.Clock's, else
// time.Now.
func (l *Limiter) localNow() time.Time {
	if l.clock != nil {
		return l.clock.Now()
	}
	return time.Now()
}

// Config returns the limiter's configuration, as passed to New.
func (l *Limiter) Config() Config { return l.cfg }

// settings are what a transaction that decides this limiter's checks
// together with others' must share with them (the client adds the
// dialect).
func (l *Limiter) settings() engine.Settings {
	return engine.Settings{Clock: l.clock, LockTimeout: l.cfg.LockTimeout, Async: l.cfg.AsyncCommit}
}

// Allow is AllowN with cost 1.
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN takes cost tokens from key's bucket if it holds that many. Being
// denied is a Result with Allowed == false, not an error; errors are invalid
// input (ErrInvalidKey, ErrInvalidCost, ErrCostExceedsCapacity, found before
// any database access), the context's, or the database's (wrapped;
// ErrNotMigrated for missing tables, ErrLockTimeout). On an error nothing is
// spent, except that a check whose context ends while its transaction
// commits may have spent its tokens without saying so (never the reverse).
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Result, error) {
	var sent time.Time
	if l.deny != nil && l.tx == nil {
		start := time.Now()
		sent = l.localNow()
		if r, ok := l.deny.lookup(key, cost, sent); ok {
			l.metrics.recordDenied(ctx, start)
			return r, nil
		}
	}
	// allowAll of one charge, without a MultiResult's slice to allocate.
	start, charges := time.Now(), []Charge{l.Charge(key, cost)}
	cl, err := decideCall(ctx, l.tx, charges)
	var m MultiResult
	if err == nil {
		m.Allowed = cl.q.Allowed
	}
	record(ctx, start, m, err, charges)
	if err != nil {
		return Result{}, err
	}
	r := decidedResult(cl.q.Outcomes[0]) // AllowAll's Results[0]
	cl.recycle()
	if l.deny != nil && l.tx == nil && !m.Allowed {
		l.deny.store(key, cost, r, sent)
	}
	return r, nil
}

// Refund gives n tokens back to key's bucket, capped at Capacity: for example
// when the work a check paid for did not happen. A refund is not tied to a
// charge, so it goes to the bucket even if the charge spent grants; to give
// a charge's credits back where they came from (its grants first), settle
// its request ID at the actual cost instead (Settle, 0 for all of it). With
// a WithRequestID context the refund is made once per ID (that ID names the
// refund, not a charge). The Result reports the bucket after the refund
// (Allowed is true). n must be >= 1 (ErrInvalidCost).
func (l *Limiter) Refund(ctx context.Context, key string, n int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if n < 1 {
		return Result{}, badArg(ErrInvalidCost, "refund %d is below 1", n)
	}
	return l.change(ctx, account.OpRefund, key, n, "refund "+quoteKey(key))
}

// Peek reports key's bucket as it is now without taking or writing anything
// (with Config.Overrides, under the key's override while it lasts).
// Remaining is the tokens it holds (negative while the key owes), Granted
// the credits of the key's live grants (Config.Grants), Allowed whether a
// check of cost 1 would be allowed (the balance, tokens plus grants, covers
// it), and RetryAfter, when it would not, how long until it would (counting
// out grants that expire before then).
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	ov, policy := l.peekOverride(key)
	l.notePolicy(ctx, l.tx != nil)
	st, now, err := l.load(ctx, key, "peek "+quoteKey(key), func(st *account.State, now *time.Time) []engine.Stmt {
		return append(engine.ReadState(l.row(key), l.clock.Param(), l.cfg.Grants, st, now), ov...)
	})
	if err != nil {
		return Result{}, err
	}
	return resultOf(account.Look(policy(now), st, now, 1)), nil
}

// Reset makes key's bucket full again by deleting its row (its refills keep
// falling on the limiter's schedule). The key's grants stay. With
// Config.Ledger it writes a "reset" row.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := validateKey(key); err != nil {
		return err
	}
	_, err := l.change(ctx, account.OpReset, key, 0, "reset "+quoteKey(key))
	return err
}

func (l *Limiter) row(key string) engine.Row {
	return engine.Row{Storage: engine.Storage(l.cfg.Storage), Prefix: l.cfg.Prefix, Key: key}
}

// charge is a charge of cost to key's bucket, with l's policy and settings.
func (l *Limiter) charge(key string, cost int64) engine.Charge {
	c := engine.Charge{Row: l.row(key), Policy: l.p, Cost: cost, Overrides: l.cfg.Overrides}
	if l.alerts != nil {
		c.Observer = l.alerts
	}
	return c
}

// change runs a request of kind on key (not a check: never coalesced), with
// the request ID of ctx, and returns its result; what names it in errors.
func (l *Limiter) change(ctx context.Context, kind account.Kind, key string, n int64, what string) (Result, error) {
	q, err := l.changeRequest(ctx, kind, key, n)
	if err != nil {
		return Result{}, err
	}
	if err := l.run(q, l.settings(), false, what); err != nil {
		return Result{}, err
	}
	return decidedResult(q.Outcomes[0]), nil
}

// changeRequest is the request of a change: kind on key for n.
func (l *Limiter) changeRequest(ctx context.Context, kind account.Kind, key string, n int64) (*engine.Request, error) {
	id, err := requestID(ctx)
	if err != nil {
		return nil, err
	}
	if id != "" && l.cfg.AsyncCommit {
		return nil, errAsyncID(l)
	}
	l.client.forgetDenied(l.cfg.Prefix, key)
	return &engine.Request{Ctx: ctx, Kind: kind, ID: id, Charges: []engine.Charge{l.charge(key, n)}}, nil
}

// quoteKey shortens and quotes a key for error messages.
func quoteKey(key string) string { return engine.QuoteKey(key) }

// resultOf is the Result of an outcome of the account model.
func resultOf(o account.Outcome) Result {
	return Result{Allowed: o.Allowed, Limit: o.Limit, Remaining: o.Remaining, RetryAfter: o.RetryAfter,
		ResetAfter: o.ResetAfter, Granted: o.Granted}
}

// decidedResult is the Result of an outcome the engine decided: with what
// the model said of it besides.
func decidedResult(o engine.Outcome) Result {
	r := resultOf(o.Outcome)
	r.FromGrants, r.Replayed = o.FromGrants, o.Replayed
	return r
}

// errAsyncID is the error of a call with a request ID on a limiter with
// AsyncCommit.
func errAsyncID(l *Limiter) error {
	return badArg(ErrInvalidArgument, "a request ID on prefix %q, whose limiter has AsyncCommit: an exactly-once charge must survive a crash (synchronous commit)", l.cfg.Prefix)
}

// Wait is WaitN with cost 1.
func (l *Limiter) Wait(ctx context.Context, key string) (Result, error) {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until a check of cost is allowed, and returns its Result.
// Between tries it sleeps the denied check's RetryAfter plus a little jitter
// (other waiters on the same key may take the tokens first, so it can take
// more than one try).
//
// When the wait a denied check reports would pass ctx's deadline, or
// Config.MaxWait since WaitN was called, WaitN returns at once with
// ErrWaitTooLong and the denied Result. When ctx ends while it sleeps, it
// returns promptly with ctx's error. Errors of AllowN are returned as they
// are.
func (l *Limiter) WaitN(ctx context.Context, key string, cost int64) (Result, error) {
	start := time.Now()
	for {
		r, err := l.AllowN(ctx, key, cost)
		if err != nil || r.Allowed {
			return r, err
		}
		wake := time.Now().Add(r.RetryAfter)
		if dl, ok := ctx.Deadline(); ok && wake.After(dl) {
			return r, fmt.Errorf("%w: %s needed, context deadline in %s", ErrWaitTooLong, r.RetryAfter, time.Until(dl).Round(time.Millisecond))
		}
		if l.cfg.MaxWait > 0 && wake.Sub(start) > l.cfg.MaxWait {
			return r, fmt.Errorf("%w: %s needed, Config.MaxWait is %s", ErrWaitTooLong, wake.Sub(start).Round(time.Millisecond), l.cfg.MaxWait)
		}
		var slack []time.Duration
		if dl, ok := ctx.Deadline(); ok {
			slack = append(slack, dl.Sub(wake))
		}
		if l.cfg.MaxWait > 0 {
			slack = append(slack, l.cfg.MaxWait-wake.Sub(start))
		}
		sleep := r.RetryAfter + time.Duration(rand.Int64N(int64(maxJitter(r.RetryAfter, slack...))+1))
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, ctx.Err()
		case <-t.C:
		}
	}
}

// maxJitter is the most a retry after a wait may be delayed: up to a tenth
// of the wait, at most 50ms, so waiters woken by the same refill do not all
// retry at the same instant; never so much that the retry would come after
// the deadline or MaxWait (it gets at most a quarter of each slack, the
// time left after the wait).
func maxJitter(wait time.Duration, slack ...time.Duration) time.Duration {
	j := min(wait/10, 50*time.Millisecond)
	for _, s := range slack {
		j = min(j, s/4)
	}
	return max(j, 0)
}

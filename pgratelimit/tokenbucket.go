package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

func (s Storage) String() string {
	switch s {
	case Durable:
		return "durable"
	case Ephemeral:
		return "ephemeral"
	}
	return fmt.Sprintf("Storage(%d)", int(s))
}

// Table names, created by the migrations in package migrations.
const (
	DurableTable   = "pgratelimit_buckets"
	EphemeralTable = "pgratelimit_ephemeral_buckets"
)

func (s Storage) table() string {
	if s == Ephemeral {
		return EphemeralTable
	}
	return DurableTable
}

// Config is a Limiter's policy: a token bucket of Capacity tokens per key that
// gains Refill tokens every Interval. The zero value is not valid: Prefix,
// Capacity, Refill and Interval are required.
type Config struct {
	// Prefix is the namespace of this limiter's keys, e.g. "api" or
	// "uploads". Limiters with different prefixes never share a bucket; two
	// limiters with the same prefix share their buckets and should share a
	// policy. Required: non-empty, valid UTF-8, no NUL, at most MaxPrefixLen
	// bytes.
	Prefix string

	// Capacity is the most tokens a bucket holds: the burst. A new key starts
	// full. Must be > 0.
	Capacity int64

	// Refill is how many tokens a bucket gains every Interval, up to Capacity.
	// Must be > 0.
	Refill int64

	// Interval is the refill period. Must be > 0 and a whole number of
	// microseconds (PostgreSQL's timestamp resolution).
	Interval time.Duration

	// Storage chooses the durable (logged) or ephemeral (UNLOGGED) table.
	// Defaults to Durable.
	Storage Storage

	// Clock, when set, replaces the database's clock: every check uses
	// Clock() as the current time. Meant for tests and simulations; in
	// production all instances should share the database's clock so that clock
	// skew cannot mint tokens. Defaults to nil: the database's
	// clock_timestamp(), read after the bucket's row lock is held.
	Clock func() time.Time

	// DisableCoalescing makes every AllowN a transaction of its own. By
	// default, checks that arrive through this Limiter while others are in
	// flight wait for a slot and are then decided together in one
	// transaction of the same shape (same statements over their distinct
	// keys, rows locked in key order, decisions in arrival order), with the
	// same results they would get one by one. This multiplies throughput,
	// most on hot keys, and adds no latency when checks do not overlap.
	// AllowNTx never coalesces. Defaults to false: coalescing on.
	DisableCoalescing bool

	// CoalesceConns is how many transactions (so pool connections) a
	// coalescing Limiter runs at once; checks beyond them queue and go in
	// the next batches. Fewer means bigger batches; more lets a database
	// with cores to spare work on several batches at once (checks of one
	// hot key gain nothing: they queue on its row lock). Capped at the
	// pool's MaxConns. Defaults to 2, the best measured on a 2-core server
	// (see README, Performance).
	CoalesceConns int

	// LockTimeout bounds how long a check waits for its bucket's row lock
	// (SET LOCAL lock_timeout) when other checks or transactions hold it:
	// past it the check fails with ErrLockTimeout, which is safe to retry,
	// instead of queueing on a hot key. It applies to the limiter's own
	// transactions, not to AllowNTx (set lock_timeout in your transaction
	// for that). Must be a whole number of milliseconds. Defaults to 0: wait
	// as long as the context allows.
	LockTimeout time.Duration

	// AsyncCommit commits the limiter's own transactions with SET LOCAL
	// synchronous_commit = off: the check does not wait for its commit to be
	// flushed to disk or replicated. Checks get cheaper, but after a crash of
	// the database the last moments of spent tokens (up to three times
	// wal_writer_delay, 600ms by default) may be forgotten, as if refunded.
	// Meant for Ephemeral storage, where a crash forgets every bucket anyway;
	// not for credits. Defaults to false.
	AsyncCommit bool

	// MaxWait bounds how long Wait and WaitN may block in all; a wait that
	// would take longer returns ErrWaitTooLong at once. Defaults to 0: only
	// the context's deadline bounds it.
	MaxWait time.Duration

	// Logger receives the limiter's diagnostics (retries, failed rollbacks).
	// Defaults to nil: discard.
	Logger *slog.Logger
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if why := checkText(c.Prefix, MaxPrefixLen); why != "" {
		return bad("Prefix %s", why)
	}
	if c.Capacity <= 0 {
		return bad("Capacity must be > 0, got %d", c.Capacity)
	}
	if c.Refill <= 0 {
		return bad("Refill must be > 0, got %d", c.Refill)
	}
	if c.Interval <= 0 {
		return bad("Interval must be > 0, got %s", c.Interval)
	}
	if c.Interval%time.Microsecond != 0 {
		return bad("Interval must be a whole number of microseconds, got %s", c.Interval)
	}
	if c.CoalesceConns < 0 {
		return bad("CoalesceConns must be >= 0, got %d", c.CoalesceConns)
	}
	if c.LockTimeout < 0 || c.LockTimeout%time.Millisecond != 0 {
		return bad("LockTimeout must be >= 0 and a whole number of milliseconds, got %s", c.LockTimeout)
	}
	if c.MaxWait < 0 {
		return bad("MaxWait must be >= 0, got %s", c.MaxWait)
	}
	if c.Storage != Durable && c.Storage != Ephemeral {
		return bad("Storage must be Durable or Ephemeral, got %d", int(c.Storage))
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
	// have happened for the same cost to be allowed (if nothing else takes
	// tokens meanwhile). Zero when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Limiter is a token-bucket rate limiter whose buckets live in PostgreSQL,
// one row per key. Each bucket holds at most Capacity tokens, starts full, and
// gains Refill tokens at every whole Interval of a grid that starts when the
// bucket is created; a check of cost n takes n tokens if there are n, else it
// is denied and takes nothing.
//
// Every check is one transaction that locks the key's row, so checks are exact
// under any concurrency, across any number of processes sharing the database.
// The time is the database's (see Config.Clock).
//
// Use Allow or AllowN to check and spend, AllowNTx to spend inside your own
// transaction, Peek to look without spending, Refund to give tokens back and
// Reset to refill a bucket. A Limiter is safe for concurrent use.
type Limiter struct {
	pool *pgxpool.Pool
	cfg  Config
	p    policy
	log  *slog.Logger
	sql  queries
	co   *coalescer // nil when Config.DisableCoalescing
	// settings are the transaction-local settings of the limiter's own
	// transactions (LockTimeout, AsyncCommit), as set_config arguments.
	settings []any
}

// New returns a Limiter for cfg that keeps its buckets in the database of
// pool. It validates cfg (ErrInvalidConfig names the bad field) and does not
// touch the database: a missing schema shows up as ErrNotMigrated on the
// first check.
func New(pool *pgxpool.Pool, cfg Config) (*Limiter, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{
		pool: pool,
		cfg:  cfg,
		p:    policy{capacity: cfg.Capacity, refill: cfg.Refill, interval: cfg.Interval},
		log:  log,
		sql:  newQueries(cfg.Storage.table()),
	}
	if cfg.LockTimeout > 0 {
		l.settings = append(l.settings, "lock_timeout", strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)+"ms")
	}
	if cfg.AsyncCommit {
		l.settings = append(l.settings, "synchronous_commit", "off")
	}
	if !cfg.DisableCoalescing {
		conns := cfg.CoalesceConns
		if conns == 0 {
			conns = 2
		}
		l.co = newCoalescer(l, min(conns, int(pool.Config().MaxConns)), defaultMaxBatch)
	}
	return l, nil
}

// Config returns the limiter's configuration, as passed to New.
func (l *Limiter) Config() Config { return l.cfg }

// queries are a Limiter's SQL statements, built once with the table name
// quoted as an identifier.
type queries struct {
	insert, lock, relock, update, peek, delete string
	// The coalesced batch's statements (see coalesce.go).
	insertMany, lockMany, relockMany, updateMany string
}

func newQueries(table string) queries {
	t := pgx.Identifier{table}.Sanitize()
	// $4 (or $3) is the caller's clock, or NULL for the database's. The
	// locking SELECT reads clock_timestamp() in an outer query, so after the
	// row lock is held.
	return queries{
		// A new row is a full bucket whose grid starts now. Its expires_at
		// ($5 after now, rounded up to the minute as bucket.expiry does) is
		// what the check that inserts it will compute, so the check's UPDATE
		// leaves the indexed column alone and stays HOT.
		insert: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, $2, $3, n, date_bin('1 minute', n + $5::interval + interval '59.999999 seconds', timestamptz 'epoch')
FROM COALESCE($4::timestamptz, now()) n
ON CONFLICT (prefix, key) DO NOTHING`,
		lock: `SELECT b.tokens, b.refilled_at, b.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT tokens, refilled_at, expires_at FROM ` + t + ` WHERE prefix = $1 AND key = $2 FOR UPDATE) b`,
		// relock is the second try after the row vanished: an upsert that
		// always returns the row, locked, because DO UPDATE locks a row that
		// another transaction inserted meanwhile (DO NOTHING would not).
		relock: `INSERT INTO ` + t + ` AS b (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, $2, $3, n, date_bin('1 minute', n + $5::interval + interval '59.999999 seconds', timestamptz 'epoch')
FROM COALESCE($4::timestamptz, now()) n
ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens
RETURNING b.tokens, b.refilled_at, b.expires_at, COALESCE($4::timestamptz, clock_timestamp())`,
		update: `UPDATE ` + t + ` SET tokens = $3, refilled_at = $4, expires_at = $5 WHERE prefix = $1 AND key = $2`,
		peek: `SELECT b.tokens, b.refilled_at, b.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT 1) one LEFT JOIN ` + t + ` b ON b.prefix = $1 AND b.key = $2`,
		delete: `DELETE FROM ` + t + ` WHERE prefix = $1 AND key = $2`,

		// $2 holds the batch's distinct keys, sorted; $5 each one's expiry
		// horizon. Rows are inserted and locked in key order. relockMany
		// is the last resort when rows keep vanishing (see runBatch).
		insertMany: `INSERT INTO ` + t + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, k.key, $3, n, date_bin('1 minute', n + k.h + interval '59.999999 seconds', timestamptz 'epoch')
FROM COALESCE($4::timestamptz, now()) n, unnest($2::text[], $5::interval[]) WITH ORDINALITY k(key, h, i)
ORDER BY k.i
ON CONFLICT (prefix, key) DO NOTHING`,
		lockMany: `SELECT b.key, b.tokens, b.refilled_at, b.expires_at, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT key, tokens, refilled_at, expires_at FROM ` + t + `
      WHERE prefix = $1 AND key = ANY($2::text[]) ORDER BY key FOR UPDATE) b`,
		relockMany: `INSERT INTO ` + t + ` AS b (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, k.key, $3, n, date_bin('1 minute', n + k.h + interval '59.999999 seconds', timestamptz 'epoch')
FROM COALESCE($4::timestamptz, now()) n, unnest($2::text[], $5::interval[]) WITH ORDINALITY k(key, h, i)
ORDER BY k.i
ON CONFLICT (prefix, key) DO UPDATE SET tokens = b.tokens
RETURNING b.key, b.tokens, b.refilled_at, b.expires_at, COALESCE($4::timestamptz, clock_timestamp())`,
		// Values are looked up by position rather than joined from
		// unnest: the statement's only plan is then the primary key index
		// scan, even as a generic plan cached while the table was empty
		// (the join's was a hash join over every row of the prefix).
		updateMany: `UPDATE ` + t + ` AS b SET
    tokens      = ($3::bigint[])[array_position($2::text[], b.key::text)],
    refilled_at = ($4::timestamptz[])[array_position($2::text[], b.key::text)],
    expires_at  = ($5::timestamptz[])[array_position($2::text[], b.key::text)]
WHERE b.prefix = $1 AND b.key = ANY($2::text[])`,
	}
}

// now returns the clock argument of the queries: nil for the database's
// clock, else Config.Clock truncated to PostgreSQL's microseconds.
func (l *Limiter) now() any {
	if l.cfg.Clock == nil {
		return nil
	}
	return l.cfg.Clock().Truncate(time.Microsecond).UTC()
}

// Allow is AllowN with cost 1.
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN takes cost tokens from key's bucket if it holds that many, in one
// transaction of its own. Being denied is a Result with Allowed == false, not
// an error; errors are invalid input (ErrInvalidKey, ErrInvalidCost,
// ErrCostExceedsCapacity, found before any database access) or the database's
// (wrapped, ErrNotMigrated for missing tables). On an error nothing is spent.
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if err := l.p.validateCost(cost); err != nil {
		return Result{}, err
	}
	if l.co != nil {
		return l.co.allowN(ctx, key, cost)
	}
	return l.allowOne(ctx, key, cost)
}

// allowOne is a check in a transaction of its own: the per-check path.
func (l *Limiter) allowOne(ctx context.Context, key string, cost int64) (Result, error) {
	return l.inOwnTx(ctx, "check "+quoteKey(key), func(ctx context.Context, q querier) (Result, error) {
		return l.check(ctx, q, key, true, cost, l.takeOp(cost))
	})
}

// Refund gives n tokens back to key's bucket, capped at Capacity: for example
// when the work a check paid for did not happen. The Result reports the bucket
// after the refund (Allowed is true). n must be >= 1 (ErrInvalidCost).
func (l *Limiter) Refund(ctx context.Context, key string, n int64) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if n < 1 {
		return Result{}, fmt.Errorf("%w: refund %d is below 1", ErrInvalidCost, n)
	}
	return l.inOwnTx(ctx, "refund "+quoteKey(key), func(ctx context.Context, q querier) (Result, error) {
		return l.check(ctx, q, key, true, 0, func(b bucket, now time.Time) (bucket, Result, bool) {
			nb, r := l.p.give(b, now, n)
			return nb, r, !nb.same(b)
		})
	})
}

// Peek reports key's bucket as it is now without taking or writing anything.
// Remaining is the tokens it holds, Allowed whether a check of cost 1 would be
// allowed, and RetryAfter, when it would not, how long until it would.
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	var (
		tokens                *int64
		refilledAt, expiresAt *time.Time
		now                   time.Time
	)
	err := l.pool.QueryRow(ctx, l.sql.peek, l.cfg.Prefix, key, l.now()).Scan(&tokens, &refilledAt, &expiresAt, &now)
	if err != nil {
		return Result{}, dbError("peek "+quoteKey(key), err)
	}
	b := l.p.fresh(now)
	if tokens != nil {
		b = l.p.load(bucket{tokens: *tokens, refilledAt: *refilledAt, expiresAt: *expiresAt}, now)
	}
	return l.p.result(b, now, 1, b.tokens >= 1), nil
}

// Reset makes key's bucket full again by deleting its row; its refill grid
// starts anew at the next check.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if _, err := l.pool.Exec(ctx, l.sql.delete, l.cfg.Prefix, key); err != nil {
		return dbError("reset "+quoteKey(key), err)
	}
	return nil
}

// quoteKey shortens and quotes a key for error messages.
func quoteKey(key string) string {
	if len(key) > 64 {
		key = key[:64] + "..."
	}
	return fmt.Sprintf("key %q", key)
}

// op decides a loaded bucket: the new bucket, the result, and whether the row
// must be written.
type op func(b bucket, now time.Time) (bucket, Result, bool)

func (l *Limiter) takeOp(cost int64) op {
	return func(b bucket, now time.Time) (bucket, Result, bool) {
		nb, r := l.p.take(b, now, cost)
		return nb, r, r.Allowed
	}
}

// querier is what a check needs of a connection or transaction.
type querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// check runs the fixed shape of a check on q: INSERT ... ON CONFLICT DO
// NOTHING and SELECT ... FOR UPDATE in one round trip (preceded by BEGIN when
// own), the decision in Go, then the UPDATE only when decide says so
// (followed by COMMIT when own) in a second round trip.
func (l *Limiter) check(ctx context.Context, q querier, key string, own bool, cost int64, decide op) (Result, error) {
	now := l.now()
	// How long a new row takes to be full again after this check: the
	// insert stores it as the row's expiry (see queries.insert).
	horizon := l.p.untilTokens(bucket{tokens: l.p.capacity - cost}, time.Time{}, l.p.capacity)
	var (
		stored bucket
		dbNow  time.Time
		found  bool
	)
	scan := func(row pgx.Row) error {
		err := row.Scan(&stored.tokens, &stored.refilledAt, &stored.expiresAt, &dbNow)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	}
	batch := &pgx.Batch{}
	if own {
		batch.Queue("BEGIN")
		l.queueSettings(batch)
	}
	batch.Queue(l.sql.insert, l.cfg.Prefix, key, l.p.capacity, now, horizon)
	batch.Queue(l.sql.lock, l.cfg.Prefix, key, now).QueryRow(scan)
	if err := q.SendBatch(ctx, batch).Close(); err != nil {
		return Result{}, err
	}
	if !found {
		// A concurrent DELETE (cleanup) removed the row between our INSERT
		// and SELECT. Insert it again, in this transaction.
		l.log.DebugContext(ctx, "pgratelimit: bucket row deleted concurrently, inserting again", "prefix", l.cfg.Prefix, "key", key)
		if err := scan(q.QueryRow(ctx, l.sql.relock, l.cfg.Prefix, key, l.p.capacity, now, horizon)); err != nil {
			return Result{}, err
		}
		if !found {
			return Result{}, errors.New("pgratelimit: upsert returned no row") // cannot happen
		}
	}

	b := l.p.load(stored, dbNow)
	nb, res, write := decide(b, dbNow)
	switch {
	case write && own:
		batch := &pgx.Batch{}
		batch.Queue(l.sql.update, l.cfg.Prefix, key, nb.tokens, nb.refilledAt, nb.expiresAt)
		batch.Queue("COMMIT")
		if err := q.SendBatch(ctx, batch).Close(); err != nil {
			return Result{}, err
		}
	case write:
		if _, err := q.Exec(ctx, l.sql.update, l.cfg.Prefix, key, nb.tokens, nb.refilledAt, nb.expiresAt); err != nil {
			return Result{}, err
		}
	case own:
		if _, err := q.Exec(ctx, "COMMIT"); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// queueSettings queues the SET LOCALs of the limiter's own transactions, as
// one parameterized set_config statement, right after BEGIN.
func (l *Limiter) queueSettings(b *pgx.Batch) {
	switch len(l.settings) {
	case 2:
		b.Queue(`SELECT set_config($1, $2, true)`, l.settings...)
	case 4:
		b.Queue(`SELECT set_config($1, $2, true), set_config($3, $4, true)`, l.settings...)
	}
}

// maxTries bounds the tries of a transaction of our own that PostgreSQL
// aborted for a deadlock or serialization failure. Such a transaction
// committed nothing, so trying again is invisible. (A deadlock needs another
// transaction that locks several bucket rows out of key order, e.g. a plain
// DELETE; checks and batches lock in key order.)
const maxTries = 3

// inOwnTx runs fn on a pooled connection that fn puts in a transaction of
// its own (BEGIN ... COMMIT inside its batches). If fn fails with the
// transaction still open, it is rolled back so the connection returns to the
// pool clean; if that fails too the pool discards the connection.
func (l *Limiter) inOwnTx(ctx context.Context, what string, fn func(context.Context, querier) (Result, error)) (Result, error) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return Result{}, dbError(what, err)
	}
	defer conn.Release()
	for try := 1; ; try++ {
		res, err := fn(ctx, conn)
		if err == nil {
			return res, nil
		}
		if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				l.log.WarnContext(ctx, "pgratelimit: rollback failed; connection discarded", "error", rerr)
			}
			cancel()
		}
		var pgErr *pgconn.PgError
		if try < maxTries && errors.As(err, &pgErr) &&
			(pgErr.Code == pgerrcode.DeadlockDetected || pgErr.Code == pgerrcode.SerializationFailure) &&
			!conn.Conn().PgConn().IsClosed() {
			l.log.DebugContext(ctx, "pgratelimit: transaction aborted by the database, retrying", "error", err, "try", try)
			continue
		}
		return Result{}, dbError(what, err)
	}
}

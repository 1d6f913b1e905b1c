package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
)

// CleanupOptions tune DeleteExpired.
type CleanupOptions struct {
	// BatchSize is how many rows one transaction deletes at most. Defaults
	// to 1000.
	BatchSize int

	// Clock, when set, replaces the database's clock in deciding what has
	// expired. Set it to the same clock as the limiters' Config.Clock, or
	// leave both nil. Defaults to nil: the database's clock_timestamp().
	Clock func() time.Time

	// StatementTimeout bounds each batch's DELETE (SET LOCAL
	// statement_timeout). Defaults to 10 seconds.
	StatementTimeout time.Duration

	// LedgerRetention, when set, deletes ledger rows (Config.Ledger) older
	// than it. Defaults to 0: the ledger is kept.
	LedgerRetention time.Duration

	// MeterProvider receives the pgratelimit.cleanup.deleted counter.
	// Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

func (o *CleanupOptions) setDefaults() error {
	if o.BatchSize < 0 {
		return fmt.Errorf("%w: BatchSize must be >= 0, got %d", ErrInvalidConfig, o.BatchSize)
	}
	if o.StatementTimeout < 0 {
		return fmt.Errorf("%w: StatementTimeout must be >= 0, got %s", ErrInvalidConfig, o.StatementTimeout)
	}
	if o.LedgerRetention < 0 {
		return fmt.Errorf("%w: LedgerRetention must be >= 0, got %s", ErrInvalidConfig, o.LedgerRetention)
	}
	if o.BatchSize == 0 {
		o.BatchSize = 1000
	}
	if o.StatementTimeout == 0 {
		o.StatementTimeout = 10 * time.Second
	}
	return nil
}

// CleanupStats describes one cleanup run.
type CleanupStats struct {
	// Deleted is the number of rows deleted, over the bucket tables and
	// the grants table.
	Deleted int64
	// Batches is the number of delete transactions run.
	Batches int
	// Duration is how long the run took.
	Duration time.Duration
	// Skipped says that another instance was cleaning, so this run did
	// nothing (Cleaner only).
	Skipped bool
	// Err is the run's error, if any (Cleaner only; DeleteExpired returns
	// it).
	Err error
}

// cleanupLockClass is the first key of the pg_try_advisory_xact_lock that
// lets one Cleaner at a time work on a schema's tables ("pglc" in ASCII);
// the second is the hash of the schema's name (current_schema(), the first
// of the search_path), so cleaners of other schemas do not wait on it.
const cleanupLockClass int32 = 0x70676c63

// DeleteExpired deletes the rows of both bucket tables (durable and
// ephemeral) whose expires_at has passed: buckets that are full again, which
// a check treats exactly like missing rows, and the grants that are spent or
// expired, which no check spends; so deleting them never changes a
// decision. It also forgets request IDs past their retention
// (Config.RequestIDRetention), and, with opts.LedgerRetention, ledger rows
// older than it. It deletes in batches of opts.BatchSize, one short transaction
// each, skipping rows that a check has locked (FOR UPDATE SKIP LOCKED), until
// a batch comes back short or ctx ends. It returns the number of rows
// deleted, also when it stops on an error.
func DeleteExpired(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions) (deleted int64, err error) {
	st, err := deleteExpired(ctx, pool, opts, false)
	return st.Deleted, err
}

func deleteExpired(ctx context.Context, pool *pgxpool.Pool, opts CleanupOptions, exclusive bool) (st CleanupStats, err error) {
	if pool == nil {
		return st, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if err := opts.setDefaults(); err != nil {
		return st, err
	}
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }() // st is the named result: this sets what is returned
	deleted := cleanupCounter(opts.MeterProvider)
	d, err := detectDialect(ctx, pool) // once per run: tables may have been distributed since
	if err != nil {
		return st, err
	}
	nodes := nodePools{}
	defer nodes.close()
	for _, ct := range cleanupTables(opts.LedgerRetention) {
		parts, err := cleanupParts(ctx, pool, d, ct, nodes, opts.StatementTimeout)
		if err != nil {
			return st, dbError("delete expired rows of "+ct.name, err)
		}
		for _, p := range parts {
			for {
				if err := ctx.Err(); err != nil {
					return st, err
				}
				var now any
				if opts.Clock != nil {
					now = opts.Clock().Truncate(time.Microsecond).UTC()
				}
				n, more, locked, err := deleteBatch(ctx, p.db, p.del, now, opts, exclusive)
				if p.gone(err) {
					break // the shard left the node: its rows are the next run's
				}
				if err != nil {
					return st, dbError("delete expired rows of "+p.table, err)
				}
				if !locked {
					st.Skipped = true
					return st, nil
				}
				st.Batches++
				st.Deleted += n
				deleted.Add(context.WithoutCancel(ctx), n)
				if !more {
					break
				}
			}
		}
	}
	return st, nil
}

// cleanupTable is a table cleanup deletes dead rows of.
type cleanupTable struct {
	name string
	// sql, when set, is the table to delete from as SQL takes it, in
	// place of name's: a Citus shard's own table (see cleanupParts).
	sql string
	// dead is the SQL condition of the rows to delete, given the SQL of
	// the time.
	dead func(now string) string
	// order is the ORDER BY of the rows to delete first, which an index
	// serves; "" walks the table by ranges of cleanupBlocks pages instead
	// (see walk).
	order string
}

// cleanupBlocks is how many of a table's pages one batch of a walk scans
// (8 MB of 8 kB pages).
const cleanupBlocks = 1024

// walk is the deleter of a table without an index for its dead rows (the
// bucket tables: an index on expires_at would keep updates that move it
// from being HOT, README "Cleanup"): each batch deletes in one range of
// cleanupBlocks pages (a TID range scan), the next range once a batch comes
// back short, up to the table's size at the first batch (rows added since
// are the next run's). batch deletes up to batchSize dead rows in pages
// [from, to), says whether it deleted that many (then the range may hold
// more) and reads the table's size in pages.
func walk(batch func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (n int64, full bool, size int64, err error)) deleter {
	var from int64
	end := int64(-1)
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		n, full, size, err := batch(ctx, tx, now, batchSize, from, from+cleanupBlocks)
		if err != nil {
			return n, false, err
		}
		if end < 0 {
			end = size
		}
		if !full {
			from += cleanupBlocks
		}
		return n, from < end, nil
	}
}

// cleanupTables are what cleanup deletes: buckets full again (expired),
// grants spent or expired, request IDs past their retention, and, with a
// ledgerRetention, ledger rows older than it.
func cleanupTables(ledgerRetention time.Duration) []cleanupTable {
	expired := func(now string) string { return "expires_at <= " + now }
	ts := []cleanupTable{
		{name: DurableTable, dead: expired},
		{name: EphemeralTable, dead: expired},
		// An expired grant of a limiter with a ledger stays until an
		// operation on its key has written its "expire" row (and set its
		// amount to 0).
		{name: GrantsTable, dead: func(now string) string { return "(amount = 0 OR expires_at <= " + now + " AND NOT ledger)" }},
		{name: RequestsTable, dead: expired, order: "ORDER BY expires_at"},
	}
	if ledgerRetention > 0 {
		age := "interval '" + sqlgen.Interval(ledgerRetention) + "'" // hours and seconds: PostgreSQL 14 reads each field as 32 bits
		ts = append(ts, cleanupTable{name: LedgerTable, dead: func(now string) string { return "at <= " + now + " - " + age }, order: "ORDER BY at"})
	}
	return ts
}

// deleter deletes one batch of expired rows in tx: how many, and whether
// there may be more.
type deleter func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (n int64, more bool, err error)

// deleteBatch runs one batch transaction. When exclusive, it first takes the
// cleanup advisory lock for the transaction and reports locked == false,
// deleting nothing, if another instance holds it.
func deleteBatch(ctx context.Context, db beginner, del deleter, now any, opts CleanupOptions, exclusive bool) (n int64, more, locked bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, false, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	batch := &pgx.Batch{}
	batch.Queue(`SELECT set_config('statement_timeout', $1, true)`, fmt.Sprintf("%dms", opts.StatementTimeout.Milliseconds()))
	locked = true
	if exclusive {
		batch.Queue(`SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, cleanupLockClass).QueryRow(func(r pgx.Row) error {
			return r.Scan(&locked)
		})
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return 0, false, false, err
	}
	if !locked {
		return 0, false, false, nil
	}
	n, more, err = del(ctx, tx, now, opts.BatchSize)
	if err != nil {
		return 0, false, true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, true, err
	}
	return n, more, true, nil
}

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Interval is the time between runs; each wait adds up to 10% of random
	// jitter so instances drift apart. Defaults to 1 minute.
	Interval time.Duration

	// BatchSize, Clock, StatementTimeout, LedgerRetention and
	// MeterProvider are as in CleanupOptions.
	BatchSize        int
	Clock            func() time.Time
	StatementTimeout time.Duration
	LedgerRetention  time.Duration
	MeterProvider    metric.MeterProvider

	// Logger receives a line per run (rows deleted, batches, duration) at
	// Info, or Warn for a failed run. Defaults to nil: discard.
	Logger *slog.Logger

	// OnRun, when set, is called after every run, e.g. to export metrics,
	// including a run cut short by Run's context (its Err is then the
	// context's). It runs on the Cleaner's goroutine: keep it quick.
	OnRun func(CleanupStats)
}

// Cleaner deletes expired bucket rows periodically. Run it in every app
// instance: in each run, only the instance that gets the cleanup advisory lock
// of the schema (pg_try_advisory_xact_lock, taken per batch transaction, so
// it works behind PgBouncer in transaction mode) deletes; the others skip.
type Cleaner struct {
	pool *pgxpool.Pool
	cfg  CleanerConfig
	opts CleanupOptions
	log  *slog.Logger
}

// NewCleaner validates cfg and returns a Cleaner. It does not start it: call
// Run.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: Interval must be >= 0, got %s", ErrInvalidConfig, cfg.Interval)
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	opts := CleanupOptions{BatchSize: cfg.BatchSize, Clock: cfg.Clock, StatementTimeout: cfg.StatementTimeout, LedgerRetention: cfg.LedgerRetention, MeterProvider: cfg.MeterProvider}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cleaner{pool: pool, cfg: cfg, opts: opts, log: log}, nil
}

// Run cleans once right away, then every Interval (plus jitter), until ctx is
// cancelled; then it returns nil promptly, abandoning a batch in flight (its
// transaction rolls back). A failed run is logged and retried at the next
// interval; Run never stops on one.
func (c *Cleaner) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		st := c.RunOnce(ctx)
		if c.cfg.OnRun != nil {
			c.cfg.OnRun(st) // also for a run cut short: its deletions happened
		}
		if ctx.Err() != nil {
			return nil
		}
		jitter := time.Duration(rand.Int64N(int64(c.cfg.Interval)/10 + 1))
		timer.Reset(c.cfg.Interval + jitter)
	}
}

// RunOnce runs one cleanup now, as Run does at each interval, logs it and
// returns its stats (the error is in CleanupStats.Err).
func (c *Cleaner) RunOnce(ctx context.Context) CleanupStats {
	st, err := deleteExpired(ctx, c.pool, c.opts, true)
	st.Err = err
	attrs := []any{"deleted", st.Deleted, "batches", st.Batches, "duration", st.Duration}
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		c.log.WarnContext(ctx, "pgratelimit: cleanup failed; retrying next interval", append(attrs, "error", err)...)
	case st.Skipped:
		c.log.DebugContext(ctx, "pgratelimit: cleanup skipped: another instance is cleaning", attrs...)
	case err == nil:
		c.log.InfoContext(ctx, "pgratelimit: cleanup", attrs...)
	}
	return st
}

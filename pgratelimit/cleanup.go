package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/cleanup"
	"go.opentelemetry.io/otel/metric"
)

// CleanupOptions tune DeleteExpired.
type CleanupOptions struct {
	// BatchSize is how many rows one transaction deletes at most. Defaults
	// to 1000.
	BatchSize int

	// Clock, when set, replaces the database's clock in deciding what has
	// expired, in every table: delivered events too are aged by it
	// (EventRetention), though their delivered_at is the database's clock.
	// Set it to the same clock as the limiters' Config.Clock, or leave both
	// nil. Defaults to nil: the database's clock_timestamp().
	Clock func() time.Time

	// StatementTimeout bounds each batch's DELETE (SET LOCAL
	// statement_timeout). Defaults to 10 seconds.
	StatementTimeout time.Duration

	// LedgerRetention, when set, deletes ledger rows (Config.Ledger) older
	// than it. Defaults to 0: the ledger is kept.
	LedgerRetention time.Duration

	// EventRetention is how long delivered usage alert events
	// (Config.Alerts) are kept after their delivery; undelivered events are
	// never deleted. Defaults to DefaultEventRetention (7 days).
	EventRetention time.Duration

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
	if o.EventRetention < 0 {
		return fmt.Errorf("%w: EventRetention must be >= 0, got %s", ErrInvalidConfig, o.EventRetention)
	}
	if o.EventRetention == 0 {
		o.EventRetention = DefaultEventRetention
	}
	if o.BatchSize == 0 {
		o.BatchSize = 1000
	}
	if o.StatementTimeout == 0 {
		o.StatementTimeout = 10 * time.Second
	}
	return nil
}

// DefaultEventRetention is how long cleanup keeps delivered events unless
// CleanupOptions.EventRetention says otherwise.
const DefaultEventRetention = 7 * 24 * time.Hour

// CleanupStats describes one cleanup run.
type CleanupStats struct {
	// Deleted is the number of rows deleted, over every table cleanup
	// walks: buckets, grants, request IDs, leases, alert state, and the
	// ledger rows and delivered events past their retention.
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

// DeleteExpired deletes the rows of both bucket tables (durable and
// ephemeral) whose expires_at has passed: buckets that are full again, which
// a check treats exactly like missing rows, and the grants that are spent
// (or expired, once their expiry is in the ledger), which no check spends;
// so deleting them never changes a decision. It also forgets request IDs
// past their retention (Config.RequestIDRetention), expired leases
// (Semaphore: their units are free already), the alert state of
// periods that have ended (Config.Alerts), usage alert events delivered
// longer ago than opts.EventRetention, and, with opts.LedgerRetention,
// ledger rows older than it. It deletes in batches of
// opts.BatchSize, one short transaction each, skipping rows that a check has
// locked (FOR UPDATE SKIP LOCKED), until a batch comes back short or ctx
// ends. It returns the number of rows deleted, also when it stops on an
// error.
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
	counter := cleanupCounter(opts.MeterProvider)
	run, err := cleanup.Run(ctx, pool, cleanup.Options{BatchSize: opts.BatchSize, Clock: opts.Clock,
		StatementTimeout: opts.StatementTimeout, LedgerRetention: opts.LedgerRetention, EventRetention: opts.EventRetention, Exclusive: exclusive,
		Deleted: func(ctx context.Context, n int64) { counter.Add(ctx, n) }})
	return CleanupStats{Deleted: run.Deleted, Batches: run.Batches, Skipped: run.Skipped, Duration: time.Since(start)}, err
}

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Interval is the time between runs; each wait adds up to 10% of random
	// jitter so instances drift apart. Defaults to 1 minute.
	Interval time.Duration

	// BatchSize, Clock, StatementTimeout, LedgerRetention,
	// EventRetention and MeterProvider are as in CleanupOptions.
	BatchSize        int
	Clock            func() time.Time
	StatementTimeout time.Duration
	LedgerRetention  time.Duration
	EventRetention   time.Duration
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
	opts := CleanupOptions{BatchSize: cfg.BatchSize, Clock: cfg.Clock, StatementTimeout: cfg.StatementTimeout, LedgerRetention: cfg.LedgerRetention, EventRetention: cfg.EventRetention, MeterProvider: cfg.MeterProvider}
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

package pgratelimit

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/cleanup"
	"go.opentelemetry.io/otel/metric"
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Interval is the time between runs of Run; each wait adds up to 10% of
	// random jitter so instances drift apart. Defaults to 1 minute.
	Interval time.Duration

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
	// never deleted. Defaults to 7 days.
	EventRetention time.Duration

	// MeterProvider receives the pgratelimit.cleanup.deleted counter.
	// Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// Logger receives a line per run (rows deleted, batches, duration) at
	// Info, or Warn for a failed run. Defaults to nil: discard.
	Logger *slog.Logger
}

// Cleaner deletes the rows of both bucket tables (durable and ephemeral)
// whose expires_at has passed: buckets that are full again, which a check
// treats exactly like missing rows, and the grants that are spent (or
// expired, once their expiry is in the ledger), which no check spends; so
// deleting them never changes a decision. It also forgets request IDs past
// their retention (Config.RequestIDRetention), expired leases (Semaphore:
// their units are free already, and the answers about them no longer
// depend on the row), the alert state of periods that have ended
// (Config.Alerts), usage alert events delivered longer ago than
// EventRetention, and, with LedgerRetention, ledger rows older than it.
//
// It deletes in batches of BatchSize, one short transaction each, skipping
// rows that a check has locked (FOR UPDATE SKIP LOCKED), until a batch comes
// back short or the context ends. Run it in every app instance: in each run,
// only the instance that gets the cleanup advisory lock of the schema
// (pg_try_advisory_xact_lock, taken per batch transaction, so it works
// behind PgBouncer in transaction mode) deletes; the others skip.
type Cleaner struct {
	pool    *pgxpool.Pool
	cfg     CleanerConfig
	log     *slog.Logger
	counter metric.Int64Counter
}

// NewCleaner validates cfg and returns a Cleaner of pool's database. It
// does not start it: call Run, or RunOnce for one run.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	bad := func(field, format string, args ...any) error {
		return configError("CleanerConfig."+field, format, args...)
	}
	switch {
	case pool == nil:
		return nil, configError("pool", "is nil")
	case cfg.Interval < 0:
		return nil, bad("Interval", "must be >= 0, got %s", cfg.Interval)
	case cfg.BatchSize < 0:
		return nil, bad("BatchSize", "must be >= 0, got %d", cfg.BatchSize)
	case cfg.StatementTimeout < 0:
		return nil, bad("StatementTimeout", "must be >= 0, got %s", cfg.StatementTimeout)
	case cfg.LedgerRetention < 0:
		return nil, bad("LedgerRetention", "must be >= 0, got %s", cfg.LedgerRetention)
	case cfg.EventRetention < 0:
		return nil, bad("EventRetention", "must be >= 0, got %s", cfg.EventRetention)
	}
	cfg.Interval = cmp.Or(cfg.Interval, time.Minute)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 1000)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, 10*time.Second)
	cfg.EventRetention = cmp.Or(cfg.EventRetention, 7*24*time.Hour)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cleaner{pool: pool, cfg: cfg, log: log, counter: cleanupCounter(cfg.MeterProvider)}, nil
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
		_, _ = c.RunOnce(ctx) // logged
		if ctx.Err() != nil {
			return nil
		}
		jitter := time.Duration(rand.Int64N(int64(c.cfg.Interval)/10 + 1))
		timer.Reset(c.cfg.Interval + jitter)
	}
}

// RunOnce runs one cleanup now, as Run does at each interval, logs it (rows
// deleted, batches, duration: Info; a failure: Warn) and returns how many
// rows it deleted, over every table it walks, also when it stops on an
// error (the rows deleted before it stay deleted). When another instance
// holds the cleanup lock it deletes nothing, returns 0 and a nil error, and
// logs that it skipped (Info).
func (c *Cleaner) RunOnce(ctx context.Context) (deleted int64, err error) {
	start := time.Now()
	run, err := cleanup.Run(ctx, c.pool, cleanup.Options{BatchSize: c.cfg.BatchSize, Clock: c.cfg.Clock,
		StatementTimeout: c.cfg.StatementTimeout, LedgerRetention: c.cfg.LedgerRetention, EventRetention: c.cfg.EventRetention, Exclusive: true,
		Deleted: func(ctx context.Context, n int64) { c.counter.Add(ctx, n) }})
	attrs := []any{"deleted", run.Deleted, "batches", run.Batches, "duration", time.Since(start)}
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		c.log.WarnContext(ctx, "pgratelimit: cleanup failed; retrying next interval", append(attrs, "error", err)...)
	case run.Skipped:
		c.log.InfoContext(ctx, "pgratelimit: cleanup skipped: another instance is cleaning", attrs...)
	case err == nil:
		c.log.InfoContext(ctx, "pgratelimit: cleanup", attrs...)
	}
	return run.Deleted, err
}

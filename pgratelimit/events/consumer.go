package events

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/alert"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Handler delivers one event. It runs inside the consumer's
// transaction, which holds the event's row locked and marks it delivered
// when the handler returns nil: tx is a savepoint of it, so what the
// handler writes with tx (a row of its own, a River job with InsertTx)
// commits exactly when the event is marked delivered, and is rolled back
// when the handler returns an error. Work outside the database (an email,
// a webhook) may be done twice if the consumer dies before it commits: use
// Event.ID to do it once.
type Handler func(ctx context.Context, tx pgx.Tx, e Event) error

// ConsumerConfig configures a Consumer. Handler is required.
type ConsumerConfig struct {
	// Handler delivers each event. Required.
	Handler Handler

	// Prefixes, when set, limits the consumer to the events of these
	// limiter prefixes. Defaults to nil: every event.
	Prefixes []string

	// BatchSize is how many events one transaction claims and delivers at
	// most. Defaults to 20.
	BatchSize int

	// PollInterval is how often the consumer looks for events when no
	// notification wakes it (retries falling due, notifications lost or
	// not delivered, as through PgBouncer in transaction mode). Defaults
	// to 1 second.
	PollInterval time.Duration

	// HandlerTimeout bounds each call of Handler (its context's deadline).
	// The batch's transaction stays open meanwhile: keep it below the
	// server's idle_in_transaction_session_timeout, if one is set, or the
	// batch is rolled back and delivered again. Defaults to 1 minute.
	HandlerTimeout time.Duration

	// MaxAttempts is how many deliveries of an event may end in a handler
	// error (Event.Attempts: one cut short by a crash is not counted)
	// before the consumer gives up on it: it stays undelivered, with its
	// last error, for List or SQL to show (and cleanup never deletes
	// it). Defaults to 25.
	MaxAttempts int

	// Backoff is how long after its n-th failed attempt (n >= 1) an event
	// is tried again. Defaults to 1s doubling at each attempt, at most an
	// hour.
	Backoff func(n int) time.Duration

	// ListenConfig is the connection the consumer LISTENs on for new
	// events: a direct connection to PostgreSQL (or PgBouncer in session
	// mode), since LISTEN does not work through PgBouncer in
	// transaction mode. Defaults to the pool's connection settings; when
	// that connection goes through a pooler (its backend is not the one it
	// opened), the consumer polls every PollInterval.
	ListenConfig *pgx.ConnConfig

	// DisableListen makes the consumer poll only. Defaults to false.
	DisableListen bool

	// Logger receives the consumer's diagnostics: handler errors at Warn,
	// the listener's fallback to polling. Defaults to nil: discard.
	Logger *slog.Logger

	// MeterProvider receives the pgratelimit.events.delivered counter.
	// Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Consumer delivers the events of pgratelimit_events (see pgratelimit.Alerts) to a
// handler: it claims undelivered events that are due with SELECT ... FOR
// UPDATE SKIP LOCKED in a transaction, calls the handler for each, marks it
// delivered (or counts a failed attempt, records its error and makes it due
// again after a backoff) and commits. Run one in every app instance: they
// share the work, and no two deliver an event at the same time (its row
// lock). Delivery is at least once: a consumer that dies mid-delivery
// leaves its events undelivered, and they are delivered later, by it or
// another. A Consumer is woken by LISTEN/NOTIFY on a connection of its own
// and polls as a fallback. Safe for concurrent use.
type Consumer struct {
	d *alert.Delivery // the machinery: claim, deliver, retry, listen
}

// NewConsumer validates cfg and returns a Consumer of the events of pool's
// database. It does not start it: call Run.
func NewConsumer(pool *pgxpool.Pool, cfg ConsumerConfig) (*Consumer, error) {
	bad := func(field, format string, args ...any) error {
		return &pgratelimit.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case pool == nil:
		return nil, bad("pool", "is nil")
	case cfg.Handler == nil:
		return nil, bad("ConsumerConfig.Handler", "is required")
	case cfg.BatchSize < 0 || cfg.BatchSize > maxLimit:
		return nil, bad("ConsumerConfig.BatchSize", "must be in [0, %d], got %d", maxLimit, cfg.BatchSize)
	case cfg.PollInterval < 0:
		return nil, bad("ConsumerConfig.PollInterval", "must be >= 0, got %s", cfg.PollInterval)
	case cfg.HandlerTimeout < 0:
		return nil, bad("ConsumerConfig.HandlerTimeout", "must be >= 0, got %s", cfg.HandlerTimeout)
	case cfg.MaxAttempts < 0:
		return nil, bad("ConsumerConfig.MaxAttempts", "must be >= 0, got %d", cfg.MaxAttempts)
	}
	for _, p := range cfg.Prefixes {
		if why := engine.CheckText(p, engine.MaxPrefixLen); why != "" {
			return nil, bad("ConsumerConfig.Prefixes", "a prefix %s", why)
		}
	}
	h, delivered := cfg.Handler, deliveredCounter(cfg.MeterProvider)
	dc := alert.DeliveryConfig{
		Handler:        func(ctx context.Context, tx pgx.Tx, r alert.EventRow) error { return h(ctx, tx, eventOf(r)) },
		Prefixes:       cfg.Prefixes,
		BatchSize:      cmp.Or(cfg.BatchSize, 20),
		PollInterval:   cmp.Or(cfg.PollInterval, time.Second),
		HandlerTimeout: cmp.Or(cfg.HandlerTimeout, time.Minute),
		MaxAttempts:    cmp.Or(cfg.MaxAttempts, 25),
		Backoff:        cfg.Backoff,
		Log:            cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		Delivered: func(ctx context.Context, prefix, kind string) {
			delivered.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
				attribute.String("pgratelimit.prefix", prefix), attribute.String("pgratelimit.event.kind", kind))))
		},
	}
	if dc.Backoff == nil {
		dc.Backoff = alert.DefaultBackoff
	}
	if !cfg.DisableListen {
		dc.Listen = cmp.Or(cfg.ListenConfig, pool.Config().ConnConfig).Copy()
	}
	return &Consumer{d: alert.NewDelivery(pool, dc)}, nil
}

// Run delivers events until ctx ends, then returns nil once its listener
// has stopped (a delivery in flight is abandoned: its transaction rolls
// back and its events are delivered later). It delivers what is due at
// once, then whenever a notification says events were written, and every
// PollInterval. A database error (a restart, a failover) is logged and
// retried at the next poll; Run never stops on one.
func (c *Consumer) Run(ctx context.Context) error {
	c.d.Run(ctx)
	return nil
}

// RunOnce delivers the events due now, a batch (one transaction) at a
// time, until a batch comes back short, and returns how many it delivered
// (committed), also when it stops on an error.
func (c *Consumer) RunOnce(ctx context.Context) (delivered int, err error) {
	return c.d.RunOnce(ctx)
}

// deliveredCounter is the pgratelimit.events.delivered counter of mp
// (otel's global provider when nil), by limiter prefix and kind (few of
// each: never a key). A refused instrument is a working no-op.
func deliveredCounter(mp metric.MeterProvider) metric.Int64Counter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	c, _ := mp.Meter("github.com/pgratelimit/pgratelimit").Int64Counter("pgratelimit.events.delivered", metric.WithUnit("{event}"),
		metric.WithDescription("Usage alert events a Consumer's handler accepted and marked delivered (committed), by limiter prefix and kind."))
	return c
}

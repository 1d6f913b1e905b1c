package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/notify"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
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
	pool      *pgxpool.Pool
	cfg       ConsumerConfig
	prefixes  any // the Prefixes as an array parameter; nil: every event
	listen    *pgx.ConnConfig
	log       *slog.Logger
	delivered metric.Int64Counter // pgratelimit.events.delivered
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
	c := &Consumer{pool: pool, cfg: cfg, listen: cfg.ListenConfig, log: cfg.Logger, delivered: deliveredCounter(cfg.MeterProvider)}
	c.cfg.BatchSize = cmp.Or(cfg.BatchSize, 20)
	c.cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 25)
	if c.cfg.PollInterval == 0 {
		c.cfg.PollInterval = time.Second
	}
	if c.cfg.HandlerTimeout == 0 {
		c.cfg.HandlerTimeout = time.Minute
	}
	if c.cfg.Backoff == nil {
		c.cfg.Backoff = defaultBackoff
	}
	if len(cfg.Prefixes) > 0 {
		c.prefixes = sqlgen.TextArray(len(cfg.Prefixes), func(i int) string { return cfg.Prefixes[i] })
	}
	if c.listen == nil {
		c.listen = pool.Config().ConnConfig
	}
	c.listen = c.listen.Copy()
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// defaultBackoff is 2^(n-1) seconds, at most an hour.
func defaultBackoff(n int) time.Duration {
	shift := 0
	if n > 1 {
		shift = min(n-1, 12)
	}
	return min(time.Second<<shift, time.Hour)
}

// Run delivers events until ctx ends, then returns nil once its listener
// has stopped (a delivery in flight is abandoned: its transaction rolls
// back and its events are delivered later). It delivers what is due at
// once, then whenever a notification says events were written, and every
// PollInterval. A database error (a restart, a failover) is logged and
// retried at the next poll; Run never stops on one.
func (c *Consumer) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if !c.cfg.DisableListen {
		wg.Go(func() { c.listenLoop(ctx, wake) })
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var due time.Time // the earliest retry this consumer scheduled; zero: none
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-wake:
		}
		start := time.Now()
		_, retry, err := c.runOnce(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "pgratelimit: delivering events failed; trying again at the next poll", "error", err)
		}
		if !due.After(start) {
			due = time.Time{} // this run found every event due by then
		}
		if at := time.Now().Add(retry); retry < math.MaxInt64 && (due.IsZero() || at.Before(due)) {
			due = at
		}
		wait := c.cfg.PollInterval
		if !due.IsZero() {
			wait = min(wait, max(time.Until(due), 0))
		}
		timer.Reset(wait)
	}
}

// RunOnce delivers the events due now, a batch (one transaction) at a
// time, until a batch comes back short, and returns how many it delivered
// (committed), also when it stops on an error.
func (c *Consumer) RunOnce(ctx context.Context) (delivered int, err error) {
	delivered, _, err = c.runOnce(ctx)
	return delivered, err
}

// runOnce is RunOnce, and says how soon the earliest retry it scheduled
// falls due (math.MaxInt64: none).
func (c *Consumer) runOnce(ctx context.Context) (delivered int, retry time.Duration, err error) {
	retry = math.MaxInt64
	for {
		b, err := c.batch(ctx)
		delivered += b.delivered
		if b.retry < retry && err == nil {
			retry = b.retry
		}
		if err != nil || !b.full {
			return delivered, retry, err
		}
	}
}

// batchRun is what a batch did: how many events it delivered, whether it
// claimed a full batch, and how soon its earliest retry falls due.
type batchRun struct {
	delivered int
	full      bool
	retry     time.Duration
}

// batch claims and delivers one batch in one transaction.
func (c *Consumer) batch(ctx context.Context) (batchRun, error) {
	run := batchRun{retry: math.MaxInt64}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, sqlgen.Events.Claim, c.cfg.BatchSize, c.prefixes)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	var done []Event
	for _, e := range evs {
		retry, err := c.deliver(ctx, tx, e)
		switch {
		case err != nil:
			return batchRun{retry: math.MaxInt64}, engine.DBError(fmt.Sprintf("deliver event %d", e.ID), err)
		case retry < 0:
			done = append(done, e)
		default:
			run.retry = min(run.retry, retry)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return batchRun{retry: math.MaxInt64}, engine.DBError("commit delivered events", err)
	}
	for _, e := range done {
		c.delivered.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(
			attribute.String("pgratelimit.prefix", e.Prefix), attribute.String("pgratelimit.event.kind", string(e.Kind)))))
	}
	run.delivered, run.full = len(done), len(evs) == c.cfg.BatchSize
	return run, nil
}

// deliver calls the handler for e in a savepoint of tx and marks e
// delivered (retry < 0), or counts its failed attempt and says when it is
// tried again (math.MaxInt64: never); err is the database's (the batch
// fails).
func (c *Consumer) deliver(ctx context.Context, tx pgx.Tx, e Event) (retry time.Duration, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, err
	}
	herr := c.call(ctx, sp, e)
	if herr == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, err
		}
		_, err := tx.Exec(ctx, sqlgen.Events.Delivered, e.ID)
		return -1, err
	}
	if err := sp.Rollback(ctx); err != nil {
		return 0, err
	}
	n, again, retry := e.Attempts+1, "", time.Duration(math.MaxInt64)
	if n < c.cfg.MaxAttempts {
		retry = max(c.cfg.Backoff(n), 0)
		again = sqlgen.Interval(retry)
	}
	c.log.WarnContext(ctx, "pgratelimit: event handler failed", "event", e.ID, "kind", e.Kind, "prefix", e.Prefix,
		"attempt", n, "giving_up", again == "", "error", herr)
	_, err = tx.Exec(ctx, sqlgen.Events.Retry, e.ID, errorText(herr), again)
	return retry, err
}

// call runs the handler for e within HandlerTimeout; a panic is its error.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, e Event) (err error) {
	hctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errHandlerPanic, r)
		}
	}()
	return c.cfg.Handler(hctx, tx, e)
}

// errHandlerPanic is the error of a handler that panicked.
var errHandlerPanic = errors.New("events: handler panicked")

// errorText is err's message as a text column takes it: valid UTF-8, no
// NUL, at most 2000 bytes.
func errorText(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "?"), "\x00", "")
	if len(s) > 2000 {
		s = s[:2000]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// listenLoop listens for notifications of new events, waking the
// consumer, until ctx ends; a lost connection is made again after a
// growing pause. If notifications cannot arrive on it (through PgBouncer in
// transaction mode), it stops: the consumer polls.
func (c *Consumer) listenLoop(ctx context.Context, wake chan<- struct{}) {
	pause := time.Second
	for ctx.Err() == nil {
		err := notify.Listen(ctx, c.listen, notify.Listener{
			Channel: sqlgen.EventsChannel,
			Ready:   func() { wakeUp(wake) }, // events written while the connection was being made
			Got: func(prefix string) {
				if len(c.cfg.Prefixes) == 0 || slices.Contains(c.cfg.Prefixes, prefix) {
					wakeUp(wake)
				}
			},
		})
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, notify.ErrPooler):
			c.log.WarnContext(ctx, "pgratelimit: notifications do not arrive on the listening connection "+
				"(PgBouncer in transaction mode? set ConsumerConfig.ListenConfig to a direct connection); polling every "+
				c.cfg.PollInterval.String())
			return
		}
		c.log.InfoContext(ctx, "pgratelimit: listening for events failed; polling meanwhile", "error", err, "retry_in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(pause*2, time.Minute)
	}
}

// wakeUp wakes the consumer, unless a wake-up is pending already.
func wakeUp(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
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

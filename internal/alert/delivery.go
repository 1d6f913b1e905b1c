package alert

import (
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
)

// EventRow is a row of pgratelimit_events as sqlgen's event columns read
// it; pgratelimit/events converts it to its Event.
type EventRow struct {
	ID                     int64
	Kind                   string // Kind.String() of the line's kind
	Prefix, Key            string
	Threshold              string // Line.Threshold(); "" for Exhausted
	Balance                int64
	Remaining              int64
	Capacity               int64
	PeriodStart, PeriodEnd time.Time
	At                     time.Time
	RequestID              string
	Attempts               int
	LastError              string
	DeliveredAt            time.Time // zero while undelivered
}

// DeliveryConfig is a Delivery's, validated and with its defaults set by
// the caller (pgratelimit/events.NewConsumer).
type DeliveryConfig struct {
	// Handler delivers an event, in a savepoint of the batch's
	// transaction; its error (or panic) is a failed attempt.
	Handler func(ctx context.Context, tx pgx.Tx, e EventRow) error
	// Prefixes limits the delivery to these limiter prefixes; nil: every
	// event.
	Prefixes []string
	// BatchSize is how many events one transaction claims at most.
	BatchSize int
	// PollInterval is how often Run looks for events when nothing wakes it.
	PollInterval time.Duration
	// HandlerTimeout bounds each call of Handler.
	HandlerTimeout time.Duration
	// MaxAttempts is how many failed attempts an event may have before it
	// is given up on (left undelivered, never due again).
	MaxAttempts int
	// Backoff is how long after its n-th failed attempt an event is due
	// again (DefaultBackoff, unless the caller chose one).
	Backoff func(n int) time.Duration
	// Listen is the connection Run LISTENs on for new events; nil: poll
	// only.
	Listen *pgx.ConnConfig
	// Log receives the diagnostics: handler errors at Warn, the
	// listener's fallback to polling. Required.
	Log *slog.Logger
	// Delivered, if not nil, is told of each event a committed batch
	// delivered.
	Delivered func(ctx context.Context, prefix, kind string)
}

// Delivery is the events consumer's machinery: it claims due events with
// FOR UPDATE SKIP LOCKED, hands each to the handler in a savepoint, marks
// it delivered or schedules its retry, and commits, batch by batch; Run
// does so whenever a notification (internal/notify) or its poll wakes it.
// An event a dead consumer held is released with its transaction's locks,
// still undelivered, and claimed again. Safe for concurrent use.
type Delivery struct {
	pool     *pgxpool.Pool
	cfg      DeliveryConfig
	prefixes any // the Prefixes as an array parameter; nil: every event
}

// NewDelivery returns the delivery of the events of pool's database by
// cfg.
func NewDelivery(pool *pgxpool.Pool, cfg DeliveryConfig) *Delivery {
	d := &Delivery{pool: pool, cfg: cfg}
	if len(cfg.Prefixes) > 0 {
		d.prefixes = sqlgen.TextArray(len(cfg.Prefixes), func(i int) string { return cfg.Prefixes[i] })
	}
	return d
}

// DefaultBackoff is 2^(n-1) seconds, at most an hour.
func DefaultBackoff(n int) time.Duration {
	shift := 0
	if n > 1 {
		shift = min(n-1, 12)
	}
	return min(time.Second<<shift, time.Hour)
}

// Run delivers events until ctx ends, then returns once its listener has
// stopped (a delivery in flight is abandoned: its transaction rolls back).
// It delivers what is due at once, then whenever a notification says
// events were written, at the earliest retry it scheduled, and every
// PollInterval. A database error is logged and retried at the next poll.
func (d *Delivery) Run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if d.cfg.Listen != nil {
		wg.Go(func() { d.listenLoop(ctx, wake) })
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var due time.Time // the earliest retry this consumer scheduled; zero: none
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-wake:
		}
		start := time.Now()
		_, retry, err := d.runOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.cfg.Log.WarnContext(ctx, "pgratelimit: delivering events failed; trying again at the next poll", "error", err)
		}
		if !due.After(start) {
			due = time.Time{} // this run found every event due by then
		}
		if at := time.Now().Add(retry); retry < math.MaxInt64 && (due.IsZero() || at.Before(due)) {
			due = at
		}
		wait := d.cfg.PollInterval
		if !due.IsZero() {
			wait = min(wait, max(time.Until(due), 0))
		}
		timer.Reset(wait)
	}
}

// RunOnce delivers the events due now, a batch (one transaction) at a
// time, until a batch comes back short, and returns how many it delivered
// (committed), also when it stops on an error.
func (d *Delivery) RunOnce(ctx context.Context) (delivered int, err error) {
	delivered, _, err = d.runOnce(ctx)
	return delivered, err
}

// runOnce is RunOnce, and says how soon the earliest retry it scheduled
// falls due (math.MaxInt64: none).
func (d *Delivery) runOnce(ctx context.Context) (delivered int, retry time.Duration, err error) {
	retry = math.MaxInt64
	for {
		b, err := d.batch(ctx)
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
func (d *Delivery) batch(ctx context.Context) (batchRun, error) {
	run := batchRun{retry: math.MaxInt64}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, sqlgen.Events.Claim, d.cfg.BatchSize, d.prefixes)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return run, engine.DBError("claim events", err)
	}
	var done []EventRow
	for _, e := range evs {
		retry, err := d.deliver(ctx, tx, e)
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
	if d.cfg.Delivered != nil {
		for _, e := range done {
			d.cfg.Delivered(ctx, e.Prefix, e.Kind)
		}
	}
	run.delivered, run.full = len(done), len(evs) == d.cfg.BatchSize
	return run, nil
}

// deliver calls the handler for e in a savepoint of tx and marks e
// delivered (retry < 0), or counts its failed attempt and says when it is
// tried again (math.MaxInt64: never); err is the database's (the batch
// fails).
func (d *Delivery) deliver(ctx context.Context, tx pgx.Tx, e EventRow) (retry time.Duration, err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, err
	}
	herr := d.call(ctx, sp, e)
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
	if n < d.cfg.MaxAttempts {
		retry = max(d.cfg.Backoff(n), 0)
		again = sqlgen.Interval(retry)
	}
	d.cfg.Log.WarnContext(ctx, "pgratelimit: event handler failed", "event", e.ID, "kind", e.Kind, "prefix", e.Prefix,
		"attempt", n, "giving_up", again == "", "error", herr)
	_, err = tx.Exec(ctx, sqlgen.Events.Retry, e.ID, errorText(herr), again)
	return retry, err
}

// call runs the handler for e within HandlerTimeout; a panic is its error.
func (d *Delivery) call(ctx context.Context, tx pgx.Tx, e EventRow) (err error) {
	hctx, cancel := context.WithTimeout(ctx, d.cfg.HandlerTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errHandlerPanic, r)
		}
	}()
	return d.cfg.Handler(hctx, tx, e)
}

// errHandlerPanic is the error of a handler that panicked (its text is
// the event's last error: the package's name is the API's).
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
func (d *Delivery) listenLoop(ctx context.Context, wake chan<- struct{}) {
	pause := time.Second
	for ctx.Err() == nil {
		err := notify.Listen(ctx, d.cfg.Listen, notify.Listener{
			Channel: sqlgen.EventsChannel,
			Ready:   func() { wakeUp(wake) }, // events written while the connection was being made
			Got: func(prefix string) {
				if len(d.cfg.Prefixes) == 0 || slices.Contains(d.cfg.Prefixes, prefix) {
					wakeUp(wake)
				}
			},
		})
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, notify.ErrPooler):
			d.cfg.Log.WarnContext(ctx, "pgratelimit: notifications do not arrive on the listening connection "+
				"(PgBouncer in transaction mode? set ConsumerConfig.ListenConfig to a direct connection); polling every "+
				d.cfg.PollInterval.String())
			return
		}
		d.cfg.Log.InfoContext(ctx, "pgratelimit: listening for events failed; polling meanwhile", "error", err, "retry_in", pause)
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

// ListQuery selects events for List: validated by the caller.
type ListQuery struct {
	Prefix, Key string    // "": any
	Since       time.Time // zero: any
	AfterID     int64     // > 0: the Limit oldest after it; else the Limit newest
	Limit       int       // > 0
}

// List reads the events q selects, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, q ListQuery) ([]EventRow, error) {
	since := "-infinity"
	if !q.Since.IsZero() {
		since = q.Since.UTC().Format(time.RFC3339Nano)
	}
	sql := sqlgen.Events.Newest
	if q.AfterID > 0 {
		sql = sqlgen.Events.After
	}
	rows, err := pool.Query(ctx, sql, q.Prefix, q.Key, since, q.AfterID, q.Limit)
	if err != nil {
		return nil, engine.DBError("list events", err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, engine.DBError("list events", err)
	}
	if q.AfterID <= 0 {
		slices.Reverse(evs)
	}
	return evs, nil
}

// Redeliver makes event id undelivered and due now, with no attempts
// counted, and notifies the consumers; found is false when there is no
// such event.
func Redeliver(ctx context.Context, pool *pgxpool.Pool, id int64) (found bool, err error) {
	rows, err := pool.Query(ctx, sqlgen.Events.Redeliver, id, sqlgen.EventsChannel)
	if err != nil {
		return false, engine.DBError("redeliver an event", err)
	}
	found = rows.Next()
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, engine.DBError("redeliver an event", err)
	}
	return found, nil
}

// scanEvents reads the events of rows (sqlgen's event columns) and closes
// them.
func scanEvents(rows pgx.Rows) ([]EventRow, error) {
	defer rows.Close()
	var evs []EventRow
	for rows.Next() {
		var (
			e         EventRow
			delivered *time.Time
		)
		if err := rows.Scan(&e.ID, &e.Kind, &e.Prefix, &e.Key, &e.Threshold, &e.Balance, &e.Remaining, &e.Capacity,
			&e.PeriodStart, &e.PeriodEnd, &e.At, &e.RequestID, &e.Attempts, &e.LastError, &delivered); err != nil {
			return nil, err
		}
		if delivered != nil {
			e.DeliveredAt = *delivered
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

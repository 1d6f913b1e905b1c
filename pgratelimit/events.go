package pgratelimit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// EventKind is what an Event says happened.
type EventKind string

// The kinds of events, one per kind of line (see Alerts).
const (
	// EventUsed: a charge took the bucket's use to Event.Fraction of its
	// Capacity or past it (Alerts.UsedFractions).
	EventUsed EventKind = "used"
	// EventBelow: a charge took the balance to Event.Level or below it
	// (Alerts.BalanceAtOrBelow).
	EventBelow EventKind = "below"
	// EventExhausted: a charge was denied because the balance did not
	// cover it (Alerts.Exhausted).
	EventExhausted EventKind = "exhausted"
)

// EventsChannel is the PostgreSQL notification channel that a check's
// transaction notifies (pg_notify, on commit) when it writes events, with
// the limiter's prefix as the payload. A Consumer listens on it.
const EventsChannel = sqlgen.EventsChannel

// Event is a usage alert: a row of pgratelimit_events, written in the
// transaction of the charge that crossed its line (see Alerts). ID is
// stable: a handler that may see an event twice (delivery is at least
// once) can use it to do its work once.
type Event struct {
	// ID is the event's, from the table's identity: increasing in the
	// order events are written, not quite in the order they commit.
	ID     int64
	Kind   EventKind
	Prefix string
	Key    string
	// Fraction is the line of an EventUsed (0.8), and Level that of an
	// EventBelow (100).
	Fraction float64
	Level    int64
	// Balance is the key's balance (bucket tokens plus live grants) after
	// the charge, or at the denial of an EventExhausted; Remaining the
	// bucket's part of it; Capacity the charging limiter's.
	Balance   int64
	Remaining int64
	Capacity  int64
	// PeriodStart and PeriodEnd bound the period the line fired in (see
	// Alerts): it fires again at the first crossing after PeriodEnd.
	PeriodStart, PeriodEnd time.Time
	// At is the check's clock (the database's, or Config.Clock).
	At time.Time
	// RequestID is the charge's (WithRequestID), or "".
	RequestID string
	// Attempts is how many deliveries have ended (the handler returned,
	// failed or panicked): for a handler, the failed ones before this one;
	// in ListEvents, every one (the one that delivered it too). A delivery
	// cut short (its consumer's process or connection died) commits
	// nothing and is not counted. LastError is the last failed one's
	// error.
	Attempts  int
	LastError string
	// DeliveredAt is when a Consumer's handler accepted the event (the
	// database's clock); zero while it is not delivered.
	DeliveredAt time.Time
}

// EventFilter selects events for ListEvents.
type EventFilter struct {
	// Prefix and Key, when set, select the events of that limiter prefix
	// and key. Defaults to "": any.
	Prefix, Key string
	// Since selects events whose check's clock (Event.At) is at or after
	// it. Defaults to the zero time: any.
	Since time.Time
	// AfterID selects the events whose ID is above it, oldest first, up to
	// Limit: to follow the table, pass the last ID seen. Defaults to 0:
	// the Limit newest events instead.
	AfterID int64
	// Limit is the most events returned, at most 10000. Defaults to 100.
	Limit int
}

// maxEventLimit bounds EventFilter.Limit.
const maxEventLimit = 10000

// ListEvents returns the events f selects, oldest first (newest last): the
// Limit newest, or with f.AfterID the Limit oldest after it. It reads
// pgratelimit_events, delivered or not, and changes nothing.
//
// Event IDs are taken when events are written and a transaction may commit
// after a later one: to follow the table without missing one, pass an
// AfterID somewhat behind the last ID seen (the events of the last few
// seconds) and skip the IDs already seen.
func ListEvents(ctx context.Context, pool *pgxpool.Pool, f EventFilter) ([]Event, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidConfig)
	case f.Limit < 0 || f.Limit > maxEventLimit:
		return nil, fmt.Errorf("%w: EventFilter.Limit must be in [0, %d], got %d", ErrInvalidConfig, maxEventLimit, f.Limit)
	}
	if why := checkText(f.Prefix, MaxPrefixLen); f.Prefix != "" && why != "" {
		return nil, fmt.Errorf("%w: EventFilter.Prefix %s", ErrInvalidConfig, why)
	}
	if f.Key != "" {
		if err := validateKey(f.Key); err != nil {
			return nil, err
		}
	}
	limit, since := f.Limit, "-infinity"
	if limit == 0 {
		limit = 100
	}
	if !f.Since.IsZero() {
		since = f.Since.UTC().Format(time.RFC3339Nano)
	}
	sql := sqlgen.Events.Newest
	if f.AfterID > 0 {
		sql = sqlgen.Events.After
	}
	rows, err := pool.Query(ctx, sql, f.Prefix, f.Key, since, f.AfterID, limit)
	if err != nil {
		return nil, engine.DBError("list events", err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, engine.DBError("list events", err)
	}
	if f.AfterID <= 0 {
		slices.Reverse(evs)
	}
	return evs, nil
}

// scanEvents reads the events of rows (sqlgen's event columns) and closes
// them.
func scanEvents(rows pgx.Rows) ([]Event, error) {
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		var (
			e         Event
			kind, thr string
			delivered *time.Time
		)
		if err := rows.Scan(&e.ID, &kind, &e.Prefix, &e.Key, &thr, &e.Balance, &e.Remaining, &e.Capacity,
			&e.PeriodStart, &e.PeriodEnd, &e.At, &e.RequestID, &e.Attempts, &e.LastError, &delivered); err != nil {
			return nil, err
		}
		e.Kind = EventKind(kind)
		switch e.Kind {
		case EventUsed:
			e.Fraction, _ = strconv.ParseFloat(thr, 64) // numeric text of a float64's shortest form
		case EventBelow:
			e.Level, _ = strconv.ParseInt(thr, 10, 64)
		}
		if delivered != nil {
			e.DeliveredAt = *delivered
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

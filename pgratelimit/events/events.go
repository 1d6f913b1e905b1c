// Package events delivers and lists the usage alert events that limiters
// with pgratelimit.Config.Alerts write: a row of pgratelimit_events in the
// transaction of the charge that crossed a line. A Consumer in every app
// instance hands each event to a Handler in a transaction of its own, at
// least once; List reads them.
package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/alert"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Kind is what an Event says happened.
type Kind string

// The kinds of events, one per kind of line (see pgratelimit.Alerts).
const (
	// Used: a charge took the bucket's use to Event.Fraction of its
	// Capacity or past it (pgratelimit.Alerts.UsedFractions).
	Used Kind = "used"
	// Below: a charge took the balance to Event.Level or below it
	// (pgratelimit.Alerts.BalanceAtOrBelow).
	Below Kind = "below"
	// Exhausted: a charge was denied because the balance did not
	// cover it (pgratelimit.Alerts.Exhausted).
	Exhausted Kind = "exhausted"
)

// Event is a usage alert: a row of pgratelimit_events, written in the
// transaction of the charge that crossed its line (see pgratelimit.Alerts). ID is
// stable: a handler that may see an event twice (delivery is at least
// once) can use it to do its work once.
type Event struct {
	// ID is the event's, from the table's identity: increasing in the
	// order events are written, not quite in the order they commit.
	ID     int64
	Kind   Kind
	Prefix string
	Key    string
	// Fraction is the line of an Used (0.8), and Level that of an
	// Below (100).
	Fraction float64
	Level    int64
	// Balance is the key's balance (bucket tokens plus live grants) after
	// the charge, or at the denial of an Exhausted; Remaining the
	// bucket's part of it; Capacity the charging limiter's.
	Balance   int64
	Remaining int64
	Capacity  int64
	// PeriodStart and PeriodEnd bound the period the line fired in (see
	// Alerts): it fires again at the first crossing after PeriodEnd.
	PeriodStart, PeriodEnd time.Time
	// At is the check's clock (the database's, or pgratelimit.Config.Clock).
	At time.Time
	// RequestID is the charge's (pgratelimit.WithRequestID), or "".
	RequestID string
	// Attempts is how many deliveries have ended (the handler returned,
	// failed or panicked): for a handler, the failed ones before this one;
	// in List, every one (the one that delivered it too). A delivery
	// cut short (its consumer's process or connection died) commits
	// nothing and is not counted. LastError is the last failed one's
	// error.
	Attempts  int
	LastError string
	// DeliveredAt is when a Consumer's handler accepted the event (the
	// database's clock); zero while it is not delivered.
	DeliveredAt time.Time
}

// Filter selects events for List.
type Filter struct {
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

// maxLimit bounds Filter.Limit.
const maxLimit = 10000

// List returns the events f selects, oldest first (newest last): the
// Limit newest, or with f.AfterID the Limit oldest after it. It reads
// pgratelimit_events, delivered or not, and changes nothing.
//
// Event IDs are taken when events are written and a transaction may commit
// after a later one: to follow the table without missing one, pass an
// AfterID somewhat behind the last ID seen (the events of the last few
// seconds) and skip the IDs already seen.
func List(ctx context.Context, pool *pgxpool.Pool, f Filter) ([]Event, error) {
	switch {
	case pool == nil:
		return nil, &pgratelimit.ConfigError{Field: "pool", Reason: "is nil"}
	case f.Limit < 0 || f.Limit > maxLimit:
		return nil, fmt.Errorf("%w: Filter.Limit must be in [0, %d], got %d", pgratelimit.ErrInvalidArgument, maxLimit, f.Limit)
	}
	if why := engine.CheckText(f.Prefix, engine.MaxPrefixLen); f.Prefix != "" && why != "" {
		return nil, fmt.Errorf("%w: Filter.Prefix %s", pgratelimit.ErrInvalidArgument, why)
	}
	if why := engine.CheckText(f.Key, engine.MaxKeyLen); f.Key != "" && why != "" {
		return nil, keyError("Filter.Key " + why)
	}
	rows, err := alert.List(ctx, pool, alert.ListQuery{Prefix: f.Prefix, Key: f.Key, Since: f.Since, AfterID: f.AfterID,
		Limit: cmp.Or(f.Limit, 100)})
	if err != nil {
		return nil, err
	}
	evs := make([]Event, len(rows))
	for i, r := range rows {
		evs[i] = eventOf(r)
	}
	return evs, nil
}

// eventOf is the Event of r: its kind, and its line (Fraction or Level)
// from the threshold's text.
func eventOf(r alert.EventRow) Event {
	e := Event{ID: r.ID, Kind: Kind(r.Kind), Prefix: r.Prefix, Key: r.Key, Balance: r.Balance, Remaining: r.Remaining,
		Capacity: r.Capacity, PeriodStart: r.PeriodStart, PeriodEnd: r.PeriodEnd, At: r.At, RequestID: r.RequestID,
		Attempts: r.Attempts, LastError: r.LastError, DeliveredAt: r.DeliveredAt}
	switch e.Kind {
	case Used:
		e.Fraction, _ = strconv.ParseFloat(r.Threshold, 64) // numeric text of a float64's shortest form
	case Below:
		e.Level, _ = strconv.ParseInt(r.Threshold, 10, 64)
	}
	return e
}

// keyError is the error of a bad key: pgratelimit.ErrInvalidKey, which
// matches pgratelimit.ErrInvalidArgument too, as the limiters' are.
type keyError string

func (e keyError) Error() string { return pgratelimit.ErrInvalidKey.Error() + ": " + string(e) }

func (e keyError) Is(target error) bool {
	return target == pgratelimit.ErrInvalidKey || target == pgratelimit.ErrInvalidArgument
}

// ErrNotFound is returned by Redeliver for an event that is not in the
// table (never written, or deleted by cleanup).
var ErrNotFound = errors.New("pgratelimit/events: event not found")

// Redeliver makes event id undelivered and due now, with no attempts
// counted, so that a Consumer delivers it again (at once: it notifies
// them), whether it was delivered or the consumers gave up on it
// (ConsumerConfig.MaxAttempts). Its LastError stays. It returns
// ErrNotFound when there is no such event.
func Redeliver(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	if pool == nil {
		return &pgratelimit.ConfigError{Field: "pool", Reason: "is nil"}
	}
	found, err := alert.Redeliver(ctx, pool, id)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: ID %d", ErrNotFound, id)
	}
	return nil
}

package sqlgen

import "github.com/jackc/pgx/v5"

// The tables of usage alerts, created by migration 00008, and the channel
// their notifications go to.
const (
	AlertStateTable = "pgratelimit_alert_state"
	EventsTable     = "pgratelimit_events"
	EventsChannel   = "pgratelimit_events"
)

// AlertStatements are the statements of usage alerts in a check's
// transaction (see internal/alert): all on one row, with scalar parameters
// and times as text, so that they run on pgx and database/sql alike, in
// every query mode and behind PgBouncer.
type AlertStatements struct {
	// ReadState reads which lines have fired for a key ($1, $2) in the
	// period starting at $3, as labels separated by spaces (no row: none).
	ReadState string
	// WriteState sets the labels fired for a key ($1, $2) in the period
	// [$3, $4): $5, separated by spaces.
	WriteState string
	// InsertEvent writes an event: kind, prefix, key, threshold (numeric
	// input, '' for none), balance, remaining, capacity, period start and
	// end, the check's time, the request ID ('' for none); it returns the
	// event's ID.
	InsertEvent string
}

// Alerts are the statements of usage alerts in a check's transaction.
var Alerts = func() AlertStatements {
	st := pgx.Identifier{AlertStateTable}.Sanitize()
	ev := pgx.Identifier{EventsTable}.Sanitize()
	return AlertStatements{
		ReadState: `SELECT array_to_string(fired, ' ') FROM ` + st + `
WHERE prefix = $1 AND key = $2 AND period_start = $3::text::timestamptz`,
		WriteState: `INSERT INTO ` + st + ` (prefix, key, period_start, period_end, fired)
VALUES ($1, $2, $3::text::timestamptz, $4::text::timestamptz, string_to_array($5::text, ' '))
ON CONFLICT (prefix, key, period_start) DO UPDATE SET period_end = excluded.period_end, fired = excluded.fired`,
		InsertEvent: `INSERT INTO ` + ev + ` (kind, prefix, key, threshold, balance, remaining, capacity, period_start, period_end, at, request_id)
VALUES ($1, $2, $3, NULLIF($4::text, '')::numeric, $5, $6, $7, $8::text::timestamptz, $9::text::timestamptz, $10::text::timestamptz, NULLIF($11::text, ''))
RETURNING id`,
	}
}()

// EventStatements are the statements that deliver and list events.
type EventStatements struct {
	// Claim locks up to $1 undelivered events due now, skipping those
	// another consumer holds, of the prefixes $2 (an array; NULL: all),
	// soonest due first.
	Claim string
	// Delivered marks event $1 delivered.
	Delivered string
	// Retry counts a failed attempt of event $1 with its error $2, due
	// again after $3 (interval input; '' never again).
	Retry string
	// Newest lists up to $5 events, newest first, of prefix $1 and key $2
	// ('' for any), at or after $3 (the check's time), with IDs above $4.
	Newest string
	// After is Newest oldest first: the first $5 events after ID $4.
	After string
	// Redeliver makes event $1 undelivered and due now, with no attempts
	// counted (its last error stays), and notifies channel $2 of its
	// prefix: a row if the event exists.
	Redeliver string
}

// eventColumns are the columns an Event is read from.
const eventColumns = `id, kind, prefix, key, COALESCE(threshold::text, ''), balance, remaining, capacity,
       period_start, period_end, at, COALESCE(request_id, ''), attempts, COALESCE(last_error, ''), delivered_at`

// Events are the statements that deliver and list events.
var Events = func() EventStatements {
	ev := pgx.Identifier{EventsTable}.Sanitize()
	list := `SELECT ` + eventColumns + ` FROM ` + ev + `
WHERE ($1::text = '' OR prefix = $1) AND ($2::text = '' OR key = $2) AND at >= $3::text::timestamptz AND id > $4
ORDER BY id `
	return EventStatements{
		Claim: `SELECT ` + eventColumns + ` FROM ` + ev + `
WHERE delivered_at IS NULL AND next_attempt_at <= clock_timestamp()
  AND ($2::text IS NULL OR prefix = ANY($2::text::text[]))
ORDER BY next_attempt_at, id
LIMIT $1 FOR UPDATE SKIP LOCKED`,
		Delivered: `UPDATE ` + ev + ` SET delivered_at = clock_timestamp(), attempts = attempts + 1 WHERE id = $1`,
		Retry: `UPDATE ` + ev + ` SET attempts = attempts + 1, last_error = $2,
    next_attempt_at = CASE WHEN $3::text = '' THEN 'infinity' ELSE clock_timestamp() + $3::text::interval END
WHERE id = $1`,
		Newest: list + `DESC LIMIT $5`,
		After:  list + `LIMIT $5`,
		Redeliver: `WITH e AS (
    UPDATE ` + ev + ` SET delivered_at = NULL, attempts = 0, next_attempt_at = clock_timestamp()
    WHERE id = $1 RETURNING prefix
)
SELECT pg_notify($2, prefix) FROM e`,
	}
}()

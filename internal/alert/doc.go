// Package alert is pgratelimit's usage alerts: the lines a limiter's
// configuration draws across a key's balance (fractions of the period's
// quota used, levels of the balance, a denial once the balance is spent),
// the periods within which each line fires at most once, and the engine
// Observer that writes an event in the very transaction of the charge that
// crosses a line; and the delivery of those events to a handler, with the
// reads of them, under pgratelimit/events' API.
//
// The pure part (lines.go, period.go) does no I/O: Spec.Crossed says which
// lines a change of balance crosses, Period which period an instant is in.
// The Observer (observer.go) asks it about every charge it watches; only
// when a charge crosses a line (or is denied, for Exhausted) does it read
// the key's alert state (pgratelimit_alert_state) in the transaction's
// Follow round trip, and write the state and the events before COMMIT.
// Every writer of a key's alert state holds the key's bucket row lock, so
// the state needs no lock of its own. A bounded memory (memory.go) of
// lines known to have fired (read so, or fired by a transaction of the
// limiter's own that committed) spares the read for charges that could only
// find them fired (the denials of a spent key); the database stays the
// authority.
//
// The Delivery (delivery.go) is the events consumer's machinery: it claims
// due events with FOR UPDATE SKIP LOCKED, one batch per transaction, calls
// the handler in a savepoint for each, marks it delivered or counts the
// failed attempt and makes it due again after a backoff (or never, after
// MaxAttempts), and commits. What a consumer held when it died is released
// with its transaction, undelivered, for another to claim. Its Run is woken
// by internal/notify's LISTEN loop and polls as the fallback. List and
// Redeliver read and reset the events table; pgratelimit/events validates,
// converts EventRow to its Event, and wires these together.
package alert

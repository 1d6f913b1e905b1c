// Package alert is pgratelimit's usage alerts: the lines a limiter's
// configuration draws across a key's balance (fractions of the period's
// quota used, levels of the balance, a denial once the balance is spent),
// the periods within which each line fires at most once, and the engine
// Observer that writes an event in the very transaction of the charge that
// crosses a line.
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
package alert

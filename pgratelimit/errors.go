package pgratelimit

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
)

// Errors returned by this package. Test for them with errors.Is. Being denied
// is not an error: it is a Result with Allowed == false.
var (
	// ErrInvalidConfig is returned by New when a Config field is out of range.
	// The message names the field.
	ErrInvalidConfig = errors.New("pgratelimit: invalid config")

	// ErrInvalidKey is returned for a key that is empty, longer than MaxKeyLen
	// bytes, not valid UTF-8, or contains a NUL byte. Nothing reaches the
	// database.
	ErrInvalidKey = errors.New("pgratelimit: invalid key")

	// ErrInvalidCost is returned for a cost (or refund) below 1.
	ErrInvalidCost = errors.New("pgratelimit: invalid cost")

	// ErrCostExceedsCapacity is returned for a cost above Config.Capacity: such
	// a check could never be allowed, so it is refused before any database
	// access rather than denied forever.
	ErrCostExceedsCapacity = errors.New("pgratelimit: cost exceeds capacity")

	// ErrLockTimeout is returned when a check waited longer than
	// Config.LockTimeout for its bucket's row lock. Nothing was spent: the
	// check can be retried.
	ErrLockTimeout = errors.New("pgratelimit: timed out waiting for the bucket's row lock (Config.LockTimeout)")

	// ErrNotMigrated is returned when the bucket tables do not exist in the
	// database the pool connects to. Apply the migrations (package migrations,
	// or the CLI's "migrate up") first.
	ErrNotMigrated = errors.New("pgratelimit: tables not found; run the migrations (migrations.Up or 'pgratelimit migrate up')")
)

// MaxKeyLen is the longest key, and MaxPrefixLen the longest Config.Prefix, in
// bytes.
const (
	MaxKeyLen    = 1024
	MaxPrefixLen = 256
)

// checkText reports why s is not a valid key or prefix, or "".
func checkText(s string, maxLen int) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes, longer than %d", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "contains a NUL byte"
		}
	}
	return ""
}

func validateKey(key string) error {
	if why := checkText(key, MaxKeyLen); why != "" {
		return fmt.Errorf("%w: key %s", ErrInvalidKey, why)
	}
	return nil
}

// validateCost checks a check's cost against the limiter's policy: a cost
// above Capacity could never be allowed, unless grants may cover the rest.
func (l *Limiter) validateCost(cost int64) error {
	if l.cfg.Grants && cost >= 1 {
		return nil
	}
	if cost < 1 {
		return fmt.Errorf("%w: %d is below 1", ErrInvalidCost, cost)
	}
	if cost > l.p.Capacity {
		return fmt.Errorf("%w: cost %d, capacity %d", ErrCostExceedsCapacity, cost, l.p.Capacity)
	}
	return nil
}

// dbError maps a database error: a missing table becomes ErrNotMigrated and
// a lock timeout ErrLockTimeout (both still wrapping the original), whatever
// the driver; everything else is wrapped with what was being done.
func dbError(op string, err error) error {
	switch sqlState(err) {
	case pgerrcode.UndefinedTable:
		return fmt.Errorf("%w: %s: %w", ErrNotMigrated, op, err)
	case pgerrcode.LockNotAvailable:
		return fmt.Errorf("%w: %s: %w", ErrLockTimeout, op, err)
	}
	return fmt.Errorf("pgratelimit: %s: %w", op, err)
}

// sqlState is the SQLSTATE of a database error, or "": pgx's
// *pgconn.PgError, lib/pq's *pq.Error and other database/sql drivers'
// errors all have a SQLState method.
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

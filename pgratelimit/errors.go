package pgratelimit

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/pgratelimit/pgratelimit/internal/engine"
)

// Errors returned by this package. Test for them with errors.Is. Being denied
// is not an error: it is a Result with Allowed == false.
var (
	// ErrInvalidConfig is returned by New when a Config field is out of range.
	// The message names the field.
	// An operation of a Semaphore on a key whose row holds a Limiter's
	// bucket is ErrInvalidConfig too: the two share a Prefix and Storage,
	// and so the keys' rows.
	ErrInvalidConfig = engine.ErrInvalidConfig

	// ErrInvalidKey is returned for a key that is empty, longer than MaxKeyLen
	// bytes, not valid UTF-8, or contains a NUL byte. Nothing reaches the
	// database.
	ErrInvalidKey = errors.New("pgratelimit: invalid key")

	// ErrInvalidCost is returned for a cost (or refund) below 1.
	ErrInvalidCost = errors.New("pgratelimit: invalid cost")

	// ErrCostExceedsCapacity is returned for a cost above Config.Capacity
	// (summed per bucket in AllowAll) of a limiter without Config.Grants,
	// and for a lease's weight above SemaphoreConfig.Max: such a call could
	// never be allowed, so it is refused before any database access rather
	// than denied forever. With Grants, a cost above Capacity is not an
	// error: the key's grants may cover the rest, and the check is decided
	// (allowed or denied, RetryAfter InfDuration when refills and grants
	// never can) like any other.
	ErrCostExceedsCapacity = errors.New("pgratelimit: cost exceeds capacity")

	// ErrLockTimeout is returned when an operation waited longer than
	// Config.LockTimeout for its bucket's row lock (or, in the caller's
	// transaction, than the lock_timeout set there). Nothing was spent: it
	// can be retried. Only row-lock waits are bounded: a transaction's
	// COMMIT is never cut short, and a Semaphore, which has no LockTimeout,
	// never returns it from transactions of its own.
	ErrLockTimeout = engine.ErrLockTimeout

	// ErrNotMigrated is returned when the bucket tables do not exist in the
	// database the pool connects to. Apply the migrations (package migrations,
	// or the CLI's "migrate up") first.
	ErrNotMigrated = engine.ErrNotMigrated
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

package pgratelimit

import (
	"errors"
	"fmt"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/lease"
)

// Errors returned by this package. Test for them with errors.Is. Being denied
// is not an error: it is a Result with Allowed == false.
//
// Three families: a configuration out of range (ErrInvalidConfig, a
// *ConfigError naming the field, returned by the constructors), a bad
// argument of one call (ErrInvalidArgument, and the more precise
// ErrInvalidKey, ErrInvalidCost, ErrCostExceedsCapacity and
// ErrInvalidRequestID, each of which also matches ErrInvalidArgument),
// refused before any database access; and what the database said
// (ErrLockTimeout, ErrNotMigrated, the ledger's and leases' answers).
var (
	// ErrInvalidConfig is returned by New, NewClient, NewSemaphore,
	// events.NewConsumer and NewCleaner when a field of their configuration is out
	// of range: the error is a *ConfigError that names the field. An
	// operation of a Semaphore on a key whose row holds a Limiter's bucket
	// is ErrInvalidConfig too: the two share a Prefix and Storage, and so
	// the keys' rows.
	ErrInvalidConfig = engine.ErrInvalidConfig

	// ErrInvalidArgument is returned for an argument of one call that can
	// never be right, before any database access: a zero or nil Tx, a
	// Charge not made by Limiter.Charge or Semaphore.Charge, charges of
	// several pools, a grant expiry past year 9999, an operation the
	// limiter's configuration does not allow (a Grant without
	// Config.Grants, a request ID with AsyncCommit, a Semaphore's Wait in a
	// transaction). The errors of a bad key, cost, request ID or lease ID
	// below match it too.
	ErrInvalidArgument = errors.New("pgratelimit: invalid argument")

	// ErrInvalidKey is returned for a key that is empty, longer than 1024
	// bytes, not valid UTF-8, or contains a NUL byte. Nothing reaches the
	// database. It matches ErrInvalidArgument too.
	ErrInvalidKey = errors.New("pgratelimit: invalid key")

	// ErrInvalidCost is returned for a cost (or refund) below 1. It matches
	// ErrInvalidArgument too.
	ErrInvalidCost = errors.New("pgratelimit: invalid cost")

	// ErrCostExceedsCapacity is returned for a cost above Config.Capacity
	// (summed per bucket in AllowAll) of a limiter without Config.Grants or
	// Config.Overrides,
	// and for a lease's weight above SemaphoreConfig.Max: such a call could
	// never be allowed, so it is refused before any database access rather
	// than denied forever. With Grants, a cost above Capacity is not an
	// error: the key's grants may cover the rest (with Overrides, the key's
	// override may be bigger), and the check is decided
	// (allowed or denied, RetryAfter InfDuration when refills and grants
	// never can) like any other. It matches ErrInvalidArgument too.
	ErrCostExceedsCapacity = errors.New("pgratelimit: cost exceeds capacity")

	// ErrInvalidRequestID is returned for a request ID (WithRequestID), or a
	// lease ID (Release, Extend: a lease's ID is its acquisition's request
	// ID), that is empty, longer than 256 bytes, not valid UTF-8, or holds a
	// NUL byte. It matches ErrInvalidArgument too.
	ErrInvalidRequestID = errors.New("pgratelimit: invalid request ID")

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

	// ErrClosed is returned by the operations of a Client's limiters and
	// semaphores once Close has been called.
	ErrClosed = errors.New("pgratelimit: client closed")

	// ErrWaitTooLong is returned by Wait and WaitN when the wait for enough
	// tokens would pass the context's deadline or Config.MaxWait. It is
	// returned at once, without sleeping.
	ErrWaitTooLong = errors.New("pgratelimit: wait would exceed the deadline")

	// ErrGrantExpired is returned by Grant for an expiry that is not after
	// the check's clock (the database's, or Config.Clock): such a grant
	// could never be spent. Nothing is granted.
	ErrGrantExpired = account.ErrGrantExpired

	// ErrUnknownRequest is returned by Settle when no allowed charge or
	// debit with that request ID is remembered for the key (it was never
	// allowed, or its Config.RequestIDRetention has passed), and by
	// admin.LookupRequest when the database holds no request with that ID.
	ErrUnknownRequest = account.ErrUnknownRequest

	// ErrRequestMismatch is returned when a request ID is reused on a bucket
	// for another operation or another amount than the one it names (a
	// charge of 5 retried as a charge of 6, a charge's ID given to a refund,
	// a settlement again at another actual cost, an AllowAll's ID on other
	// buckets), as payment APIs answer a reused idempotency key. Nothing is
	// changed.
	ErrRequestMismatch = account.ErrRequestMismatch

	// ErrLeaseExpired is returned by Release and Extend of a lease whose
	// TTL has passed (by the check's clock) since it was acquired or last
	// extended: its units no longer count, and another holder may have
	// them. Its row remains until cleanup deletes it.
	ErrLeaseExpired = lease.ErrExpired

	// ErrLeaseNotFound is returned by Extend of a lease the key does not
	// have: released, never acquired, or expired and deleted by cleanup.
	ErrLeaseNotFound = lease.ErrNotFound
)

// ConfigError is the error of a configuration field out of range: Field
// names it ("Config.Capacity", "SemaphoreConfig.TTL", ...), Reason says
// what is wrong with it. errors.Is(err, ErrInvalidConfig) holds for it;
// errors.As finds it.
type ConfigError struct {
	Field  string
	Reason string
}

// Error reads "pgratelimit: invalid config: " then the field and the
// reason.
func (e *ConfigError) Error() string {
	return ErrInvalidConfig.Error() + ": " + e.Field + " " + e.Reason
}

// Is makes a ConfigError match ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// configError is a *ConfigError of field, its reason made of format and
// args.
func configError(field, format string, args ...any) error {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// argError is the error of a bad argument: it matches ErrInvalidArgument and
// kind (nil: ErrInvalidArgument alone), and reads kind's message then msg.
type argError struct {
	kind error
	msg  string
}

func (e *argError) Error() string { return e.kind.Error() + ": " + e.msg }

func (e *argError) Is(target error) bool { return target == ErrInvalidArgument || target == e.kind }

// badArg is an error of kind (ErrInvalidArgument, ErrInvalidKey, ...) that
// also matches ErrInvalidArgument, its message made of format and args.
func badArg(kind error, format string, args ...any) error {
	return &argError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// The longest key (1024), prefix (256) and request or lease ID (256), in
// bytes.
const (
	maxKeyLen       = engine.MaxKeyLen
	maxPrefixLen    = engine.MaxPrefixLen
	maxRequestIDLen = engine.MaxRequestIDLen
)

// checkText reports why s is not a valid key or prefix, or "".
func checkText(s string, maxLen int) string { return engine.CheckText(s, maxLen) }

func validateKey(key string) error {
	if why := checkText(key, maxKeyLen); why != "" {
		return badArg(ErrInvalidKey, "key %s", why)
	}
	return nil
}

// validateCost checks a check's cost against the limiter's policy: a cost
// above Capacity could never be allowed, unless grants may cover the rest
// or the key's override may be bigger.
func (l *Limiter) validateCost(cost int64) error {
	if (l.cfg.Grants || l.cfg.Overrides) && cost >= 1 {
		return nil
	}
	if cost < 1 {
		return badArg(ErrInvalidCost, "%d is below 1", cost)
	}
	if cost > l.p.Capacity {
		return badArg(ErrCostExceedsCapacity, "cost %d, capacity %d", cost, l.p.Capacity)
	}
	return nil
}

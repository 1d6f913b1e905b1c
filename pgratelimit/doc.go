// Package pgratelimit is a token-bucket rate limiter and quota keeper whose
// buckets live in PostgreSQL: exact under concurrency, across any number of
// app instances, with no Redis to run.
//
// # The bucket
//
// A Limiter keeps one bucket per key. A bucket holds at most Config.Capacity
// tokens and starts full. At every whole multiple of Config.Interval since
// the Unix epoch (or at the boundaries of a Config.Calendar: every day, week
// or month in a time zone) it gains Config.Refill tokens, capped at
// Capacity. Refills fall on that fixed schedule, whatever happens to the
// bucket's row: progress towards the next refill is never lost, so traffic
// just under the refill rate is allowed. Right around a refill moment a full
// bucket can let Capacity+Refill tokens through in quick succession; a small
// Interval makes the limit smooth.
//
// Credits granted beyond the bucket (Limiter.Grant, Config.Grants) are
// spent after its tokens; request IDs (WithRequestID) make a retried charge
// count once; Settle brings an estimate to its actual cost; the ledger
// (Config.Ledger) records every change.
//
// A check of cost n takes n tokens if the bucket holds n (Result.Allowed),
// else it takes nothing, writes nothing, and says when to retry
// (Result.RetryAfter). A cost above Capacity could never succeed and is an
// error, ErrCostExceedsCapacity. Tokens are int64 and the arithmetic
// saturates.
//
// # One check, one transaction
//
// Each check is a transaction of fixed shape, pipelined into two round trips:
//
//	BEGIN
//	INSERT INTO pgratelimit_buckets ... ON CONFLICT (prefix, key) DO NOTHING
//	SELECT tokens, refilled_at, ... FOR UPDATE      -- and the database's clock
//	-- refill math in Go
//	UPDATE ...                                      -- only when allowed
//	COMMIT
//
// The row lock makes concurrent checks of one key queue up, which is what
// makes them exact. No session state is used (settings only for the
// transaction: set_config(..., true), or SET LOCAL on Citus; no PREPARE, no
// session advisory locks), so it works behind PgBouncer in transaction mode.
//
// Limiter.In runs any operation in the caller's own transaction (PgxTx, or
// SQLTx for database/sql with any driver), with the same statements, so
// tokens are spent only if the caller's own write commits.
//
// # Several limits at once
//
// AllowAll charges several buckets (any limiters of one Client, any keys) in
// one transaction, all or nothing: "10 per second and 1000 per day", or a
// user's and an organization's credits. Rows are locked in one global order,
// so no order of charges can deadlock. Limiters that share a Prefix share
// buckets, also with different policies: that is how per-customer plans
// work.
//
// # Concurrency leases
//
// A Semaphore limits how many things run at once rather than how many start
// per second: Acquire takes a lease of some weight on a key if the live
// leases' weights leave room under SemaphoreConfig.Max, Release gives it
// back, Extend keeps it alive, and a lease whose holder died counts until
// its TTL passes. Wait waits for room. Leases take part in AllowAll
// (Charge.Semaphore) and In like any charge; each carries a fencing token
// that only grows.
//
// # Usage alerts
//
// Config.Alerts names thresholds (a fraction of the period used, a balance
// at or below an amount, exhaustion). The charge that crosses one writes an
// event in its own transaction, once per period; a Consumer of package
// events (events.NewConsumer) hands each to a Handler in a transaction
// where the app's own writes commit with the delivery, so each is handled
// exactly once.
//
// # Clients
//
// A Client holds what the limiters of one pool share: the coalescer and the
// database's dialect (plain PostgreSQL or Citus, asked once). Make one with
// NewClient, limiters with Client.NewLimiter, and Close it at shutdown to
// let the checks in flight finish. New(pool, cfg) makes a limiter with a
// client of its own, which is never closed.
//
// # Coalescing
//
// By default, checks that arrive through the limiters of one Client while its
// transactions are busy wait and are then decided together in one
// transaction of the same shape: the distinct rows inserted and locked in
// order, every check decided in Go in arrival order, one UPDATE. Results
// are exactly those of the checks run one by one in that order; throughput
// rises several times, most on hot keys. A batch never waits for a row that
// another transaction holds: it skips it (SKIP LOCKED), and that row's
// checks wait for it alone. See Config.DisableCoalescing and
// ClientConfig.CoalesceConns.
//
// # Metrics
//
// Config.MeterProvider (default: the global OpenTelemetry one) receives
// pgratelimit.checks, pgratelimit.check.duration and pgratelimit.batch.size;
// cleanup reports pgratelimit.cleanup.deleted, a Semaphore
// pgratelimit.leases.held and pgratelimit.leases.denied, alerts
// pgratelimit.events.emitted and pgratelimit.events.delivered.
//
// # Time
//
// By default the time is the database's clock_timestamp(), read after the row
// lock is held: one clock for all instances, so clock skew between app servers
// cannot mint tokens. Config.Clock replaces it in tests. Elapsed time is
// clamped at zero; a clock that goes backwards adds nothing.
//
// # Expiry
//
// Every row records when its bucket is full again (expires_at, rounded up to
// the minute). From then on the row means exactly what a missing row means (a
// full bucket, refilled on the same schedule), so deleting expired rows never
// changes a decision.
//
// # Schema
//
// The tables come from the goose migrations in package migrations. A Limiter
// with Storage Durable uses a logged table (right for credits); Ephemeral uses
// an UNLOGGED one (faster; emptied after a crash, so right for request rates).
// Config.AsyncCommit keeps the logged table but commits without waiting for
// the WAL flush: a server crash forgets the last moments' charges, as if
// refunded (never money: limiters with Grants or Ledger refuse it).
// On Citus, distribute them by key (migrations.Distribute): a Client finds
// out when it is made (Client.Detect asks again), sends each check whose buckets' shards sit on one node straight
// to that node, where it runs on the shards' own tables (internal/citus;
// ClientConfig.DisableRouting turns that off), and sends the rest through the
// coordinator in statements that each route to one shard.
//
// # Reading the code
//
// This package is the API. A check goes downwards only, through internal
// packages whose imports the compiler and a test enforce: the coalescer
// (internal/coalesce), the engine's one transaction shape
// (internal/engine), the SQL text (internal/sqlgen), and the pure model of a
// key's balance (internal/account); Citus's dialect, router and cleanup
// parts are internal/citus, cleanup internal/cleanup. docs/internals.md
// draws them and follows one check through them.
package pgratelimit

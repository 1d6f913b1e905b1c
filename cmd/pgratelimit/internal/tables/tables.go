// Package tables names the tables that package migrations creates, for the
// few statements of the pgratelimit command's own: the bench's scratch
// prefill and its count of events, the demo's revoking of its grants and
// clearing of its alerts, and what migrate distribute reports. The library
// no longer exports their names (its constants are deprecated); the schema
// is part of what the project keeps stable (see CHANGELOG.md), so they stay
// these.
package tables

const (
	// Buckets is the durable storage's bucket table (Storage Durable); a
	// Semaphore's leases are a column of its keys' rows.
	Buckets = "pgratelimit_buckets"
	// EphemeralBuckets is the ephemeral storage's bucket table, unlogged
	// (Storage Ephemeral).
	EphemeralBuckets = "pgratelimit_ephemeral_buckets"
	// Grants holds the keys' grants (Config.Grants).
	Grants = "pgratelimit_grants"
	// Requests remembers request IDs (WithRequestID), and Ledger holds the
	// ledger's entries (Config.Ledger).
	Requests = "pgratelimit_requests"
	Ledger   = "pgratelimit_ledger"
	// AlertState remembers the alert lines that have fired per key and
	// period, and Events is the outbox of usage alerts (Config.Alerts).
	AlertState = "pgratelimit_alert_state"
	Events     = "pgratelimit_events"
)

// Distributed are the tables that migrate distribute (migrations.
// Distribute) distributes by key on Citus, in its order.
var Distributed = []string{Buckets, EphemeralBuckets, Grants, Requests, Ledger}

// Coordinator are the tables that stay on the Citus coordinator, not
// distributed: consumers claim events across keys.
var Coordinator = []string{AlertState, Events}

// Package tables names the tables that package migrations creates, for the
// few statements of the pgratelimit command's own: the bench's scratch
// prefill, the demo's revoking of its grants, and what migrate distribute
// reports. The library no longer exports their names (its constants are
// deprecated); the schema is part of what the project keeps stable (see
// CHANGELOG.md), so they stay these.
package tables

const (
	// Buckets is the durable storage's bucket table (Storage Durable).
	Buckets = "pgratelimit_buckets"
	// EphemeralBuckets is the ephemeral storage's bucket table, unlogged
	// (Storage Ephemeral).
	EphemeralBuckets = "pgratelimit_ephemeral_buckets"
	// Grants holds the keys' grants (Config.Grants).
	Grants = "pgratelimit_grants"
)

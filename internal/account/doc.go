// Package account is the pure model of a key's balance: a token bucket
// (tokens, possibly a debt, refilled on a schedule), the credits granted
// beside it, and the request IDs it remembers. One function per operation
// (charge, debit, refund, settle, grant, reset; expiry and refill happen as
// time passes) returns the new state, the outcome and the ledger entries the
// change implies. It does no I/O and knows nothing of SQL, contexts or the
// public API: the engine loads a State, applies operations in arrival order
// and writes the difference; nothing else changes a balance.
//
// Invariants, checked by the fuzz tests: the entries of an operation add up
// to its change of the balance (tokens plus live grants); no grant goes below
// zero; a denied operation changes nothing; a replay of a request ID changes
// nothing and returns the first outcome.
//
// All arithmetic saturates: tokens and amounts are int64 and times are
// bounded by MaxTime.
package account

package sqlgen

import (
	"hash/fnv"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// LeaseTokensSequence is the sequence of the leases' fencing tokens,
// created by the migrations: logged, so that tokens never go back, not even
// after a crash empties the unlogged bucket table.
const LeaseTokensSequence = "pgratelimit_lease_tokens"

// LeaseStatements are the statements of the concurrency leases
// (internal/lease) kept in one bucket table. A key's leases are the leases
// column of its row (migration 00009), which the engine's lock reads with
// the row and writes back (Table.UpdateData); this lists it without a lock.
type LeaseStatements struct {
	// List reads a key's leases ($1, $2) with the clock ($3, else the
	// database's): NULL leases when it has none, or no row.
	List string
}

// Leases and EphemeralLeases are the lease statements of the two bucket
// tables.
var (
	Leases          = leaseStatements(pgx.Identifier{DurableTable}.Sanitize())
	EphemeralLeases = leaseStatements(pgx.Identifier{EphemeralTable}.Sanitize())
)

func leaseStatements(t string) LeaseStatements {
	return LeaseStatements{
		List: `SELECT b.leases, COALESCE($3::timestamptz, clock_timestamp())
FROM (SELECT 1) one LEFT JOIN ` + t + ` b ON b.prefix = $1 AND b.key = $2`,
	}
}

// LeaseTokens reads $1 new fencing tokens, in increasing order.
var LeaseTokens = `SELECT nextval(` + quoteLiteral(LeaseTokensSequence) + `::regclass) FROM generate_series(1, $1::bigint)`

// LeaseChannel is the LISTEN/NOTIFY channel of the releases of prefix's
// leases: a fixed name and a hash of the prefix (a channel name is at most
// 63 bytes), so that another prefix on the same channel only costs a waiter
// a needless try.
func LeaseChannel(prefix string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(prefix))
	return "pgratelimit_leases_" + strconv.FormatUint(h.Sum64(), 16)
}

// Listen is the statement that listens on channel c (LeaseChannel's, or
// EventsChannel).
func Listen(c string) string { return `LISTEN ` + pgx.Identifier{c}.Sanitize() }

// BackendPID reads the process ID of the backend that answers: on a
// connection through a pooler it is not the one the connection was opened
// with.
const BackendPID = `SELECT pg_backend_pid()`

// quoteLiteral quotes s, one of our own names, as a string literal.
func quoteLiteral(s string) string { return `'` + s + `'` }

package engine

import (
	"time"

	"github.com/pgratelimit/pgratelimit/internal/account"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Reads: what Peek, Grants and Ledger read, as statements any
// Executor runs (a pool's, or the caller's transaction), locking nothing.

// ReadState returns the statements that read r's account into st (its
// bucket, and its grants with credits left when grants), and the clock
// (clock, or the database's) into now.
func ReadState(r Row, clock any, grants bool, st *account.State, now *time.Time) []Stmt {
	stmts := []Stmt{readBucket(r, clock, st, now)}
	if grants {
		stmts = append(stmts, readGrants(r, st))
	}
	return stmts
}

// ReadGrants returns the statements that read r's grants with credits left
// into st, and the clock (clock, or the database's) into now.
func ReadGrants(r Row, clock any, st *account.State, now *time.Time) []Stmt {
	return []Stmt{readClock(clock, now), readGrants(r, st)}
}

func readBucket(r Row, clock any, st *account.State, now *time.Time) Stmt {
	return Stmt{SQL: r.Storage.Statements().Peek, Args: []any{r.Prefix, r.Key, clock}, Scan: func(rs RowScanner) error {
		for rs.Next() {
			var (
				tokens, capacity      *int64
				refilledAt, expiresAt *time.Time
			)
			if err := rs.Scan(&tokens, &refilledAt, &expiresAt, &capacity, now); err != nil {
				return err
			}
			if tokens != nil {
				st.Bucket = account.Bucket{Tokens: *tokens, RefilledAt: *refilledAt, ExpiresAt: *expiresAt}
				if capacity != nil {
					st.Bucket.Capacity = *capacity
				}
			}
		}
		return rs.Err()
	}}
}

func readGrants(r Row, st *account.State) Stmt {
	return Stmt{SQL: sqlgen.Grants.List, Args: []any{r.Prefix, r.Key}, Scan: func(rs RowScanner) error {
		for rs.Next() {
			var g account.Grant
			var exp *time.Time
			if err := rs.Scan(&g.ID, &g.Amount, &exp, &g.GrantedAt, &g.Ledger); err != nil {
				return err
			}
			if exp != nil {
				g.ExpiresAt = *exp
			}
			st.Grants = append(st.Grants, g)
		}
		return rs.Err()
	}}
}

// ReadOverride is the statement that reads r's override, calling found
// with it if r has one.
func ReadOverride(r Row, found func(Override)) Stmt {
	return Stmt{SQL: sqlgen.Overrides.Read, Args: []any{r.Prefix, r.Key}, Scan: func(rs RowScanner) error {
		for rs.Next() {
			var o Override
			var until *time.Time
			if err := rs.Scan(&o.Capacity, &o.Refill, &until); err != nil {
				return err
			}
			if until != nil {
				o.Until = *until
			}
			found(o)
		}
		return rs.Err()
	}}
}

// readClock reads the clock (clock, or the database's) into now.
func readClock(clock any, now *time.Time) Stmt {
	return Stmt{SQL: `SELECT COALESCE($1::timestamptz, clock_timestamp())`, Args: []any{clock}, Scan: func(rs RowScanner) error {
		for rs.Next() {
			if err := rs.Scan(now); err != nil {
				return err
			}
		}
		return rs.Err()
	}}
}

// LedgerRow is a row of the ledger, as the API's LedgerEntry has it (same
// fields, same order: the API converts it).
type LedgerRow struct {
	ID           int64
	At           time.Time
	Amount       int64
	GrantsAmount int64
	Kind         string
	RequestID    string
	Balance      int64
	Granted      int64
}

// ReadLedger reads r's ledger rows since since (all of them for the zero
// time), oldest first, into es.
func ReadLedger(r Row, since time.Time, es *[]LedgerRow) Stmt {
	return Stmt{SQL: sqlgen.Ledger.List, Args: []any{r.Prefix, r.Key, since.UTC().Format(time.RFC3339Nano)}, Scan: func(rs RowScanner) error {
		for rs.Next() {
			var e LedgerRow
			if err := rs.Scan(&e.ID, &e.At, &e.Amount, &e.Kind, &e.RequestID, &e.Balance, &e.GrantsAmount, &e.Granted); err != nil {
				return err
			}
			*es = append(*es, e)
		}
		return rs.Err()
	}}
}

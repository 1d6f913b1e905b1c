package pgratelimit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgx/v5"
	"github.com/pgratelimit/pgratelimit/internal/account"
)

// citus is a Citus cluster with distributed bucket tables, through the
// coordinator (checks routed to the nodes speak onShards): every statement
// must route to one shard, so it filters on one row's full primary key with
// scalar parameters.
type citus struct{}

func (citus) kind() Dialect { return Citus }

func (citus) shape(int, bool) shape { return citusRow{} }

// set: SET LOCAL commands, which Citus passes on to the workers (where the
// row locks are) when told to; set_config is not propagated.
func (citus) set(pairs []string) []stmt {
	stmts := []stmt{{sql: "SET LOCAL citus.propagate_set_commands = 'local'"}}
	for i := 0; i < len(pairs); i += 2 {
		stmts = append(stmts, stmt{sql: "SET LOCAL " + pairs[i] + " = '" + pairs[i+1] + "'"}) // our own names and values
	}
	return stmts
}

// oneRowBatches: a transaction over several shards would need two-phase
// commit.
func (citus) oneRowBatches() bool { return true }

// deleter: the same DELETE on every shard, run there by
// run_command_on_shards, when cleanup cannot run it on the shards' nodes
// itself (see cleanupParts), since Citus cannot lock rows by ctid across
// shards
// (its condition's quotes doubled inside format's literal). The time is the
// coordinator's. A walk scans the same range of pages in every shard, up to
// the largest shard's size.
func (citus) deleter(ct cleanupTable) deleter {
	dead := strings.ReplaceAll(ct.dead("%L::timestamptz"), "'", "''")
	// Each shard's result is "n size": the rows it deleted and its size
	// in pages (0 when not walking).
	const sums = `SELECT coalesce(sum(split_part(result, ' ', 1)::bigint) FILTER (WHERE success), 0),
       coalesce(max(split_part(result, ' ', 1)::bigint) FILTER (WHERE success), 0),
       coalesce(max(split_part(result, ' ', 2)::bigint) FILTER (WHERE success), 0),
       coalesce(string_agg(result, '; ') FILTER (WHERE NOT success), '')
FROM run_command_on_shards($1::regclass, format(`
	run := func(ctx context.Context, tx pgx.Tx, sql string, batchSize int, args ...any) (n int64, full bool, size int64, err error) {
		var most int64
		var failed string
		if err := tx.QueryRow(ctx, sql, args...).Scan(&n, &most, &size, &failed); err != nil {
			return 0, false, 0, err
		}
		if failed != "" {
			return n, false, 0, fmt.Errorf("on some shards: %s", failed)
		}
		return n, most >= int64(batchSize), size, nil
	}
	if ct.order == "" {
		del := sums + `
  'WITH d AS (DELETE FROM %%1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %%1$s WHERE ctid >= ''(%s,0)''::tid AND ctid < ''(%s,0)''::tid AND ` + dead + ` LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING 1)
   SELECT count(*) || '' '' || pg_relation_size(''%%1$s'') / current_setting(''block_size'')::bigint FROM d',
  $3::bigint, $4::bigint, COALESCE($2::timestamptz, now()), $5::int))`
		return walk(func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (int64, bool, int64, error) {
			return run(ctx, tx, del, batchSize, ct.name, now, from, to, batchSize)
		})
	}
	del := sums + `
  'WITH d AS (DELETE FROM %%1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %%1$s WHERE ` + dead + ` ` + ct.order + ` LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING 1)
   SELECT count(*) || '' 0'' FROM d',
  COALESCE($2::timestamptz, now()), $3::int))`
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		n, full, _, err := run(ctx, tx, del, batchSize, ct.name, now, batchSize)
		return n, full, err
	}
}

// citusRow is oneRow in statements that Citus's fast path plans for one
// shard, from a plan kept per connection: the lock is a plain SELECT of the
// bucket table, and the database's clock is read by a statement of its own
// after the locks (Citus plans every execution of a statement with a
// volatile function afresh).
type citusRow struct{ oneRow }

// lock: each row's lock, then its grants' when a spends them, for the rows
// it holds.
func (citusRow) lock(s Storage, rows []row, a *attempt) []stmt {
	ts := &s.statements().Citus
	sql := ts.Lock
	if a.mode != waitLocks {
		sql = ts.LockSkip
	}
	scan := a.scanRows(s, false, false)
	var stmts []stmt
	for _, r := range rows {
		stmts = append(stmts, stmt{sql: sql, args: []any{r.prefix, r.key, a.clock}, scan: scan})
		stmts = append(stmts, citusGrants(s, r, a)...)
	}
	return stmts
}

// relock, then the clock again: these rows were locked after it was read.
func (c citusRow) relock(s Storage, rows []row, a *attempt) []stmt {
	scan := a.scanRows(s, false, false)
	var stmts []stmt
	for _, r := range rows {
		stmts = append(stmts, stmt{sql: s.statements().Citus.Relock, args: []any{r.prefix, r.key, a.interval(r), a.clock}, scan: scan})
		stmts = append(stmts, citusGrants(s, r, a)...)
	}
	return append(stmts, c.clock(a)...)
}

// citusGrants reads r's grants, locked, if a spends grants of s: skipping
// locked ones when a skips locked rows (only a transaction that holds r's
// bucket locks its grants, and then r's bucket is not a's).
func citusGrants(s Storage, r row, a *attempt) []stmt {
	if !a.withGrants(s) {
		return nil
	}
	sql := sqlgen.Grants.LockOne
	if a.mode != waitLocks {
		sql = sqlgen.Grants.LockOneSkip
	}
	return []stmt{{sql: sql, args: []any{r.prefix, r.key}, scan: func(rs rowScanner) error {
		var g account.Grant
		var exp *time.Time
		r := row{storage: s}
		for rs.Next() {
			if err := rs.Scan(&r.prefix, &r.key, &g.ID, &g.Amount, &exp, &g.Ledger); err != nil {
				return err
			}
			st, held := a.state[r]
			if !held {
				continue
			}
			g.ExpiresAt = time.Time{}
			if exp != nil {
				g.ExpiresAt = *exp
			}
			st.Grants = append(st.Grants, g)
		}
		return rs.Err()
	}}}
}

func (citusRow) clock(a *attempt) []stmt {
	if a.clock != nil {
		return nil
	}
	return []stmt{a.readClock()}
}

package pgratelimit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
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
// run_command_on_shards, since Citus cannot lock rows by ctid across shards.
// The time is the coordinator's.
func (citus) deleter(ct cleanupTable) deleter {
	del := `SELECT coalesce(sum(split_part(result, ' ', 2)::bigint) FILTER (WHERE success), 0),
       coalesce(max(split_part(result, ' ', 2)::bigint) FILTER (WHERE success), 0),
       coalesce(string_agg(result, '; ') FILTER (WHERE NOT success), '')
FROM run_command_on_shards($1::regclass, format(
  'DELETE FROM %%1$s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %%1$s WHERE ` + ct.dead("%L") + ` ` + ct.order + ` LIMIT %s FOR UPDATE SKIP LOCKED))',
  COALESCE($2::timestamptz, now()), $3::int))`
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		var n, most int64
		var failed string
		if err := tx.QueryRow(ctx, del, ct.name, now, batchSize).Scan(&n, &most, &failed); err != nil {
			return 0, false, err
		}
		if failed != "" {
			return n, false, fmt.Errorf("on some shards: %s", failed)
		}
		return n, most >= int64(batchSize), nil
	}
}

// citusRow is oneRow in statements that Citus's fast path plans for one
// shard, from a plan kept per connection: the lock is a plain SELECT of the
// bucket table, and the database's clock is read by a statement of its own
// after the locks (Citus plans every execution of a statement with a
// volatile function afresh).
type citusRow struct{ oneRow }

func (citusRow) lock(s Storage, rows []row, a *attempt) []stmt {
	sql, scan := a.lockSQL(&s.statements().citus, s), a.scanInto(s)
	return perRow(rows, func(r row) stmt {
		return stmt{sql: sql, args: []any{r.prefix, r.key, a.clock}, scan: scan}
	})
}

// relock, then the clock again: these rows were locked after it was read.
func (c citusRow) relock(s Storage, rows []row, a *attempt) []stmt {
	sql, scan := a.relockSQL(&s.statements().citus, s), a.scanInto(s)
	return append(perRow(rows, func(r row) stmt {
		return stmt{sql: sql, args: []any{r.prefix, r.key, a.interval(r), a.clock}, scan: scan}
	}), c.clock(a)...)
}

func (citusRow) clock(a *attempt) []stmt {
	if a.clock != nil {
		return nil
	}
	return []stmt{a.readClock()}
}

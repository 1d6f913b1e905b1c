// Package cleanup deletes the rows no check tells from missing ones:
// buckets full again, spent and expired grants, request IDs past their
// retention, the alert state of past periods and, if asked, old ledger rows
// and delivered events. It deletes in batches, one short
// transaction each, skipping rows a check holds; on Citus, shard by shard on
// the nodes that hold them (internal/citus says where).
package cleanup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/citus"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Options are a run's, validated and with defaults set by the caller.
type Options struct {
	BatchSize        int
	Clock            func() time.Time // nil: the database's
	StatementTimeout time.Duration
	LedgerRetention  time.Duration
	EventRetention   time.Duration // 0: keep delivered events
	// Deleted, if not nil, is told the rows each batch deleted.
	Deleted func(ctx context.Context, n int64)
	// Exclusive takes the schema's cleanup advisory lock in each batch,
	// and ends the run (Stats.Skipped) if another instance holds it.
	Exclusive bool
}

// Stats describe a run.
type Stats struct {
	Deleted int64
	Batches int
	Skipped bool
}

// LockClass is the first key of the pg_try_advisory_xact_lock that lets
// one cleaner at a time work on a schema's tables ("pglc" in ASCII); the
// second is the hash of the schema's name (current_schema(), the first of
// the search_path), so cleaners of other schemas do not wait on it.
const LockClass int32 = 0x70676c63

// Run deletes the dead rows of every table, batch by batch, until a batch
// comes back short or ctx ends. It returns what it did also when it stops on
// an error.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) (Stats, error) {
	var st Stats
	d, err := citus.Detect(ctx, engine.PgxExecutor{Q: pool}) // once per run: tables may have been distributed since
	if err != nil {
		return st, err
	}
	pools := citus.NewPools(pool)
	pools.One, pools.ConnectTimeout = true, opts.StatementTimeout
	defer pools.Close()
	for _, ct := range sqlgen.CleanupTables(opts.LedgerRetention, opts.EventRetention) {
		parts, err := partsOf(ctx, pool, d, ct, pools)
		if err != nil {
			return st, engine.DBError("delete expired rows of "+ct.Name, err)
		}
		for _, p := range parts {
			if done, err := p.run(ctx, opts, &st); done || err != nil {
				return st, err
			}
		}
	}
	return st, nil
}

// part is where a table's batches run: all of it through the pool, or one
// shard on its node.
type part struct {
	db    beginner
	del   deleter
	desc  string // for errors: the table, and the shard and node
	shard bool
}

// beginner is a pool or a connection.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// partsOf returns where ct's batches run: through pool, or, on Citus when
// every shard can be, on each shard's node.
func partsOf(ctx context.Context, pool *pgxpool.Pool, d engine.Dialect, ct sqlgen.CleanupTable, pools *citus.Pools) ([]part, error) {
	local := []part{{db: pool, del: deleterOf(pgx.Identifier{ct.Name}.Sanitize(), ct), desc: ct.Name}}
	if d.Name() != "citus" {
		return local, nil
	}
	where, shards, err := citus.CleanupParts(ctx, pool, ct.Name, pools)
	switch {
	case err != nil:
		return nil, err
	case where == citus.Local:
		return local, nil
	case where == citus.ViaCoordinator:
		return []part{{db: pool, del: coordinatorDeleter(ct), desc: ct.Name}}, nil
	}
	parts := make([]part, len(shards))
	for i, sh := range shards {
		del := deleterOf(sh.Table, ct)
		parts[i] = part{db: sh.Pool, desc: sh.Desc, shard: true, del: func(ctx context.Context, tx pgx.Tx, now any, n int) (int64, bool, error) {
			if err := sh.Guard(ctx, tx); err != nil {
				return 0, false, err
			}
			return del(ctx, tx, now, n)
		}}
	}
	return parts, nil
}

// run runs p's batches; done says another instance is cleaning (the run
// stops, skipped) or ctx ended.
func (p part) run(ctx context.Context, opts Options, st *Stats) (done bool, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		var now any
		if opts.Clock != nil {
			now = opts.Clock().Truncate(time.Microsecond).UTC()
		}
		n, more, locked, err := batch(ctx, p.db, p.del, now, opts)
		if p.shard && citus.Gone(err) {
			return false, nil // the shard left the node: its rows are the next run's
		}
		if err != nil {
			return true, engine.DBError("delete expired rows of "+p.desc, err)
		}
		if !locked {
			st.Skipped = true
			return true, nil
		}
		st.Batches++
		st.Deleted += n
		if opts.Deleted != nil {
			opts.Deleted(context.WithoutCancel(ctx), n)
		}
		if !more {
			return false, nil
		}
	}
}

// deleter deletes one batch of expired rows in tx: how many, and whether
// there may be more.
type deleter func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (n int64, more bool, err error)

// batch runs one batch transaction. With opts.Exclusive, it first takes the
// cleanup advisory lock for the transaction and reports locked == false,
// deleting nothing, if another instance holds it.
func batch(ctx context.Context, db beginner, del deleter, now any, opts Options) (n int64, more, locked bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, false, false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('statement_timeout', $1, true)`, fmt.Sprintf("%dms", opts.StatementTimeout.Milliseconds()))
	locked = true
	if opts.Exclusive {
		b.Queue(`SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`, LockClass).QueryRow(func(r pgx.Row) error {
			return r.Scan(&locked)
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, false, false, err
	}
	if !locked {
		return 0, false, false, nil
	}
	n, more, err = del(ctx, tx, now, opts.BatchSize)
	if err != nil {
		return 0, false, true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, true, err
	}
	return n, more, true, nil
}

// blocks is how many of a table's pages one batch of a walk scans (8 MB of
// 8 kB pages).
const blocks = 1024

// walk is the deleter of a table without an index for its dead rows (the
// bucket tables: an index on expires_at would keep updates that move it
// from being HOT): each batch deletes in one range of blocks pages (a TID
// range scan), the next range once a batch comes back short, up to the
// table's size at the first batch (rows added since are the next run's).
// b deletes up to batchSize dead rows in pages [from, to), says whether it
// deleted that many (then the range may hold more) and reads the table's
// size in pages.
func walk(b func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (n int64, full bool, size int64, err error)) deleter {
	var from int64
	end := int64(-1)
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		n, full, size, err := b(ctx, tx, now, batchSize, from, from+blocks)
		if err != nil {
			return n, false, err
		}
		if end < 0 {
			end = size
		}
		if !full {
			from += blocks
		}
		return n, from < end, nil
	}
}

// deleterOf deletes ct's dead rows from table t (as SQL takes it): the
// oldest that no check holds, or, walking t, those of a range of its pages.
func deleterOf(t string, ct sqlgen.CleanupTable) deleter {
	dead := ct.Dead(sqlgen.CleanupNow)
	if ct.Order == "" {
		del := sqlgen.DeleteWalk(t, dead)
		return walk(func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (n int64, full bool, size int64, err error) {
			err = tx.QueryRow(ctx, del, now, batchSize, from, to, t).Scan(&n, &size)
			return n, n >= int64(batchSize), size, err
		})
	}
	del := sqlgen.DeleteOrdered(t, dead, ct.Order)
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		tag, err := tx.Exec(ctx, del, now, batchSize)
		n := tag.RowsAffected()
		return n, n >= int64(batchSize), err
	}
}

// coordinatorDeleter deletes ct's dead rows on every shard at once,
// through the coordinator (see sqlgen.CitusDeleteWalk).
func coordinatorDeleter(ct sqlgen.CleanupTable) deleter {
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
	if ct.Order == "" {
		del := sqlgen.CitusDeleteWalk(ct.Dead)
		return walk(func(ctx context.Context, tx pgx.Tx, now any, batchSize int, from, to int64) (int64, bool, int64, error) {
			return run(ctx, tx, del, batchSize, ct.Name, now, from, to, batchSize)
		})
	}
	del := sqlgen.CitusDeleteOrdered(ct.Dead, ct.Order)
	return func(ctx context.Context, tx pgx.Tx, now any, batchSize int) (int64, bool, error) {
		n, full, _, err := run(ctx, tx, del, batchSize, ct.Name, now, batchSize)
		return n, full, err
	}
}

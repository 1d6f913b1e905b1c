package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// scratch is the run's schema, with pgratelimit's tables, and a connection
// of its own to set it up, read its statistics and drop it.
type scratch struct {
	env         Env
	name        string
	admin       *pgx.Conn
	table       string // the bucket table of the run's storage
	distributed bool
}

// createScratch creates a schema of a random name, bounded by env.Bound;
// sets env.Pool's search_path to it and the pool's size to the run's;
// migrates it, distributes it on Citus (with --citus, or when the citus
// extension is installed), grants every key --grants credits, and prefills
// it with --prefill rows (not bounded: ten million rows take minutes).
func createScratch(ctx context.Context, env Env, o Options, cfg pgratelimit.Config) (*scratch, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &scratch{env: env, name: "pgratelimit_bench_" + hex.EncodeToString(b[:]), table: sqlgen.DurableTable}
	if cfg.Storage == pgratelimit.Ephemeral {
		s.table = sqlgen.EphemeralTable
	}
	sctx, cancel := env.bound(ctx)
	defer cancel()
	admin, err := pgx.ConnectConfig(sctx, env.Pool.ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := admin.Exec(sctx, "CREATE SCHEMA "+pgx.Identifier{s.name}.Sanitize()); err != nil {
		admin.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("creating scratch schema: %w", err)
	}
	s.admin = admin
	env.Pool.ConnConfig.RuntimeParams["search_path"] = s.name
	env.Pool.MaxConns = int32(o.conns())
	err = s.setUp(sctx, o, cfg)
	cancel() // set up
	if err == nil && o.Prefill > 0 {
		err = s.prefill(ctx, env.Progress, cfg, o.Prefill)
	}
	if err != nil {
		_ = s.remove(ctx)
		return nil, err
	}
	return s, nil
}

// setUp migrates the schema, distributes it if it may (with --citus, it
// must), and grants.
func (s *scratch) setUp(ctx context.Context, o Options, cfg pgratelimit.Config) error {
	db := stdlib.OpenDB(*s.env.Pool.ConnConfig)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	switch err := migrations.Distribute(ctx, db); {
	case err == nil:
		s.distributed = true
	case !errors.Is(err, migrations.ErrNoCitus) || o.Citus:
		return err
	}
	if o.Overrides > 0 {
		// One key in every 1/F, with the run's own capacity and refill: the
		// checks read the override and decide as without it, so the audit
		// holds.
		step := max(1, int(math.Round(1/o.Overrides)))
		if _, err := db.ExecContext(ctx, `INSERT INTO pgratelimit_overrides (prefix, key, capacity, refill, note)
SELECT $1, 'key-' || i, $2, $3, 'bench' FROM generate_series(0, $4 - 1) AS i WHERE i % $5 = 0`, cfg.Prefix, cfg.Capacity, cfg.Refill, o.Keys, step); err != nil {
			return err
		}
	}
	if o.Grants > 0 {
		_, err := db.ExecContext(ctx, `INSERT INTO pgratelimit_grants (prefix, key, amount)
SELECT $1, 'key-' || i, $2 FROM generate_series(0, $3 - 1) AS i`, cfg.Prefix, o.Grants, o.Keys)
		return err
	}
	return nil
}

// remove drops the schema, bounded by env.Bound (after an interrupt too),
// and closes the connection.
func (s *scratch) remove(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	defer s.admin.Close(ctx)
	dctx, cancel := s.env.bound(ctx)
	defer cancel()
	if _, err := s.admin.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{s.name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("dropping scratch schema: %w", err)
	}
	return nil
}

// prefill fills the bucket table with n rows of cfg's prefix, keys key-0 to
// key-(n-1), each a full bucket as a check long ago left it (refilled on the
// grid, full again since: expires_at passed, which no run's cleanup sees,
// since the bench runs none), in transactions of a million rows, each in
// random order as checks would have added them (in the order of i the keys'
// index would be half empty: "key-1000000" and on go in the middle of
// "key-100000"'s, every page split leaving the left half full and never
// added to again); then VACUUM ANALYZE and, if the role may, CHECKPOINT.
func (s *scratch) prefill(ctx context.Context, w io.Writer, cfg pgratelimit.Config, n int) error {
	name := pgx.Identifier{s.name, s.table}.Sanitize()
	ins := `INSERT INTO ` + name + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, 'key-' || i, $2, date_bin($3::interval, now() - interval '1 hour', timestamptz 'epoch'), date_bin('1 minute', now() - interval '1 minute', timestamptz 'epoch')
FROM generate_series($4::bigint, $5::bigint) AS i
ORDER BY hashint8(i)`
	start := time.Now()
	const chunk = 1_000_000
	for from := 0; from < n; from += chunk {
		to := min(from+chunk, n) - 1
		if _, err := s.admin.Exec(ctx, ins, cfg.Prefix, cfg.Capacity, sqlgen.Interval(cfg.Interval), from, to); err != nil {
			return fmt.Errorf("prefilling %s: %w", name, err)
		}
		fmt.Fprintf(w, "\r\033[Kprefill: %d of %d rows, %s", to+1, n, time.Since(start).Round(time.Second))
	}
	fmt.Fprint(w, "\r\033[K")
	if _, err := s.admin.Exec(ctx, `VACUUM (ANALYZE) `+name); err != nil { // on Citus, on every shard
		return fmt.Errorf("vacuuming %s: %w", name, err)
	}
	_, _ = s.admin.Exec(ctx, `CHECKPOINT`) // needs superuser or pg_checkpoint: else skipped
	return nil
}

// tableStats puts in rep the HOT-update ratio of the run's table, the
// events written with --alerts and, when sizes is set, the table's and its
// indexes' size.
func (s *scratch) tableStats(ctx context.Context, rep *Report, sizes bool) error {
	time.Sleep(700 * time.Millisecond) // statistics of exited backends arrive shortly
	var upd, hot int64
	if err := s.admin.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
		s.name, s.table).Scan(&upd, &hot); err == nil && upd > 0 {
		rep.Updates, rep.HotRatio = upd, math.Round(1000*float64(hot)/float64(upd))/1000
	}
	if rep.Alerts {
		events := pgx.Identifier{s.name, sqlgen.EventsTable}.Sanitize()
		if err := s.admin.QueryRow(ctx, `SELECT count(*) FROM `+events).Scan(&rep.Events); err != nil {
			return fmt.Errorf("counting the events: %w", err)
		}
	}
	if !sizes {
		return nil
	}
	query := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`
	if s.distributed {
		query = `SELECT citus_table_size($1::regclass), citus_total_relation_size($1::regclass) - citus_table_size($1::regclass)`
	}
	name := pgx.Identifier{s.name, s.table}.Sanitize()
	if err := s.admin.QueryRow(ctx, query, name).Scan(&rep.TableBytes, &rep.IndexBytes); err != nil {
		return fmt.Errorf("reading the table's size: %w", err)
	}
	return nil
}

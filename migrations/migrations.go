// Package migrations holds pgratelimit's schema as goose SQL migrations and
// applies them.
//
// The SQL files are embedded in FS. Up, Down and Status run them through a
// goose Provider that keeps its own version table, VersionTable, so they never
// touch an application's goose_db_version, and that takes a session advisory
// lock while it works, so app instances starting at once do not race. The
// tables are created in the first schema of the connection's search_path.
//
// Because of that session lock, run migrations over a direct connection (or
// PgBouncer in session mode), not through PgBouncer in transaction mode. The
// limiter itself needs no session state.
//
// With a *pgxpool.Pool, get a *sql.DB from it with stdlib.OpenDBFromPool.
//
// Teams that run goose themselves can apply the files of FS (or of this
// folder) with their own goose, keeping a separate version table:
//
//	goose -dir migrations -table pgratelimit_goose_version postgres "$DATABASE_URL" up
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the goose SQL migration files.
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the table in which goose records which of these
// migrations are applied.
const VersionTable = "pgratelimit_goose_version"

// lockID is the advisory lock key taken while migrating: "pgrlmig" in ASCII,
// distinct from goose's default so an app's own migrations are not blocked.
const lockID int64 = 0x7067726c6d6967

// NewProvider returns the goose Provider that Up, Down and Status use, for
// callers who need more of goose (UpTo, DownTo, ...).
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	if err != nil {
		return nil, fmt.Errorf("pgratelimit migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("pgratelimit migrations: %w", err)
	}
	return p, nil
}

// Up applies every migration not yet applied. Running it again is a no-op.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := NewProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgratelimit migrations: up: %w", err)
	}
	return nil
}

// Down rolls back the most recently applied migration. Rolling back the first
// one drops the bucket tables and every bucket in them.
func Down(ctx context.Context, db *sql.DB) error {
	p, err := NewProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Down(ctx); err != nil {
		return fmt.Errorf("pgratelimit migrations: down: %w", err)
	}
	return nil
}

// Status reports every migration and whether it is applied.
func Status(ctx context.Context, db *sql.DB) ([]*goose.MigrationStatus, error) {
	p, err := NewProvider(db)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgratelimit migrations: status: %w", err)
	}
	return st, nil
}

// ErrNoCitus is returned by Distribute when the database does not have the
// citus extension.
var ErrNoCitus = errors.New("pgratelimit migrations: the citus extension is not installed in this database; run CREATE EXTENSION citus on the coordinator first")

// Distribute distributes the bucket, grants, requests, ledger and overrides tables by key
// across a Citus cluster (create_distributed_table, colocated), so that
// every statement of a check routes to the one shard that holds its key. Run
// it on the coordinator after Up (and again after an Up that added a table);
// running it again is a no-op. It returns ErrNoCitus when the citus
// extension is missing.
//
// The usage alert tables (pgratelimit_alert_state and pgratelimit_events,
// migration 00008) stay on the coordinator, not distributed: consumers claim
// events across keys with FOR UPDATE SKIP LOCKED, which Citus runs only on
// one shard, and only a charge that fires an alert writes to them (its
// transaction then spans the coordinator and the key's node). So does
// pgratelimit_policies (migration 00010), written once per process.
func Distribute(ctx context.Context, db *sql.DB) error {
	var citus bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return fmt.Errorf("pgratelimit migrations: distribute: %w", err)
	}
	if !citus {
		return ErrNoCitus
	}
	// Tables distributed by the same text column are colocated by default:
	// a key's grants live on its buckets' node, so a check's statements all
	// route to one node.
	for _, table := range []string{"pgratelimit_buckets", "pgratelimit_ephemeral_buckets", "pgratelimit_grants", "pgratelimit_requests", "pgratelimit_ledger", "pgratelimit_overrides"} {
		var exists, distributed bool
		err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`, table).Scan(&exists, &distributed)
		switch {
		case err != nil:
			return fmt.Errorf("pgratelimit migrations: distribute %s: %w", table, err)
		case !exists:
			return fmt.Errorf("pgratelimit migrations: distribute: %s does not exist; run the migrations (Up) first", table)
		case distributed:
			continue
		}
		if _, err := db.ExecContext(ctx, `SELECT create_distributed_table($1::regclass, 'key')`, table); err != nil {
			return fmt.Errorf("pgratelimit migrations: distribute %s: %w", table, err)
		}
	}
	return nil
}

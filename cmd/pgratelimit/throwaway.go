package main

import (
	"context"
	"database/sql"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's driver "pgx"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/throwaway"
	"github.com/pgratelimit/pgratelimit/migrations"
)

// dbMore ends db's help: what the database is, and how to use it.
const dbMore = `The database is for trying pgratelimit: it listens on 127.0.0.1 only, and anyone on
this machine can connect to it as the superuser postgres with no password. It takes
PostgreSQL's server binaries (initdb, postgres) from PATH, /usr/lib/postgresql/*/bin or
the folder $PGRATELIMIT_PG_BIN names; run as root, the server runs as the postgres
OS user.

Its stdout is one line, printed once the migrations are applied: DATABASE_URL=postgres://...
Export it in another shell; in a script:
    pgratelimit db > db.env &
    until [ -s db.env ]; do sleep 0.2; done; export "$(cat db.env)"
`

// runDB is `pgratelimit db`: a throwaway PostgreSQL (package throwaway) with
// the migrations applied, its DATABASE_URL line on stdout (and what to do
// with it on stderr), kept until interrupted, then stopped and removed.
func runDB(ctx context.Context, c *cli, args []string) int {
	cmd, _ := lookupCommand("db")
	f := newFlagSet(c, cmd)
	port := f.Int("port", 0, "the loopback port to listen on (default: a free one)")
	f.DurationVar(&f.timeout, "timeout", cmd.timeout, cmd.timeoutUse)
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	if *port < 0 || *port > 65535 {
		return f.fail(usagef("--port must be between 0 and 65535, got %d", *port))
	}
	fmt.Fprintln(c.stderr, "Starting a throwaway PostgreSQL...")
	sctx, cancel := f.withTimeout(ctx)
	defer cancel()
	db, err := throwaway.Start(sctx, *port)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		return f.fail(err)
	}
	defer func() {
		if err := db.Close(ctx); err != nil {
			fmt.Fprintf(c.stderr, "pgratelimit db: stopping the throwaway PostgreSQL (its data is in %s): %v\n", db.DataDir, err)
			return
		}
		fmt.Fprintln(c.stderr, "Stopped the throwaway PostgreSQL and removed its data.")
	}()
	sqlDB, err := sql.Open("pgx", db.URL)
	if err == nil {
		err = migrations.Up(sctx, sqlDB)
		sqlDB.Close()
	}
	cancel()
	if ctx.Err() != nil { // interrupted while starting: not an error
		return exitOK
	}
	if err != nil {
		return f.fail(fmt.Errorf("applying the migrations: %w", err))
	}
	fmt.Fprintln(c.stdout, "DATABASE_URL="+db.URL)
	fmt.Fprintf(c.stderr, `PostgreSQL %s on %s, with pgratelimit's tables. In another shell:
    export DATABASE_URL=%s
    pgratelimit allow user-1
It runs until Ctrl-C, which stops it and removes its data.
`, db.Version, db.Addr, db.URL)
	<-ctx.Done()
	return exitOK
}

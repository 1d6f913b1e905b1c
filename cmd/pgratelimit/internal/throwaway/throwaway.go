// Package throwaway starts a PostgreSQL to try pgratelimit on: a cluster
// made with the installed server binaries (internal/pglaunch), listening on
// a loopback TCP port with no password, and removed when closed.
// `pgratelimit db` and the demo use it.
package throwaway

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
)

// DB is a running throwaway PostgreSQL.
type DB struct {
	// URL connects to its postgres database as the superuser postgres:
	// postgres://postgres@127.0.0.1:PORT/postgres. It has no query (the
	// server has no TLS, which pgx and libpq find out for themselves), so it
	// can be pasted into any shell, or a .env file, unquoted.
	URL string
	// Addr is where it listens: 127.0.0.1:PORT.
	Addr string
	// Version is the server's version, such as "15.14".
	Version string
	// DataDir is its data directory, removed by Close.
	DataDir string

	in *pglaunch.Instance
}

// Start starts a throwaway PostgreSQL listening on 127.0.0.1:port (0: a free
// port). When there are no server binaries to start one with, its error
// says how to get them.
func Start(ctx context.Context, port int) (*DB, error) {
	in, err := pglaunch.StartLocal(ctx, pglaunch.Options{TCP: true, Port: port})
	if err != nil {
		return nil, explain(err, port)
	}
	db, err := describe(ctx, in)
	if err != nil {
		_ = in.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return db, nil
}

// describe reads the instance's address and the server's version.
func describe(ctx context.Context, in *pglaunch.Instance) (*DB, error) {
	u, err := url.Parse(in.URL)
	if err != nil {
		return nil, err
	}
	u.RawQuery = ""
	db := &DB{URL: u.String(), Addr: u.Host, DataDir: in.DataDir, in: in}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return nil, fmt.Errorf("connecting to the throwaway PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&db.Version); err != nil {
		return nil, err
	}
	db.Version, _, _ = strings.Cut(db.Version, " ") // "15.14 (Debian 15.14-0+deb12u1)"
	return db, nil
}

// explain says why no PostgreSQL started, and what to do.
func explain(err error, port int) error {
	switch {
	case errors.Is(err, pglaunch.ErrNoServerBinaries):
		return fmt.Errorf("cannot start a throwaway PostgreSQL: %w; install PostgreSQL's server "+
			"(Debian, Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install postgresql), "+
			"or set %s to the folder of its initdb and postgres", err, pglaunch.BinDirEnv)
	case port != 0 && strings.Contains(err.Error(), "ddress already in use"):
		return fmt.Errorf("port %d of 127.0.0.1 is taken: choose another (or 0: a free one)", port)
	}
	return fmt.Errorf("starting a throwaway PostgreSQL: %w", err)
}

// Close stops the server and removes its data, within 30s, also once ctx
// is done (an interrupt is what ends a throwaway PostgreSQL).
func (db *DB) Close(ctx context.Context) error {
	if db.in == nil {
		return errors.New("throwaway: not started")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return db.in.Close(ctx)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// explain says what went wrong in the user's terms: what to do for the
// errors a user can fix, and the library's or the database's own words, less
// their package prefixes (the command name already heads the line), for the
// rest.
func (f *flags) explain(err error) string {
	var ue clierr.UsageError
	var ce *pgconn.ConnectError
	timedOut := f.timedOut()
	switch {
	case errors.As(err, &ue):
		return ue.Msg
	case errors.Is(err, pgratelimit.ErrNotMigrated):
		return "the pgratelimit tables are not in this database (or not on its search_path): create them with 'pgratelimit migrate up'"
	case timedOut && (errors.As(err, &ce) || !f.connected.Load()):
		return fmt.Sprintf("gave up after %s (--timeout) connecting to %s", f.timeout, f.target)
	case timedOut:
		return fmt.Sprintf("gave up after %s (--timeout): the database had not finished", f.timeout)
	case errors.As(err, &ce) && errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("could not connect to %s: no answer within %s (%s)", target(ce.Config), f.connectTimeout, f.connectFrom)
	case errors.As(err, &ce):
		return fmt.Sprintf("could not connect to %s: %s", target(ce.Config), connectReason(ce))
	case errors.Is(err, context.Canceled):
		return "interrupted"
	}
	return clierr.Text(err)
}

// target names the database server of cfg.
func target(cfg *pgconn.Config) string {
	if cfg == nil {
		return "the database"
	}
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		addr = fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	return fmt.Sprintf("the database at %s (user %q, database %q)", addr, cfg.User, cfg.Database)
}

// connectReason says why a connection failed, in the server's or the
// network's words.
func connectReason(ce *pgconn.ConnectError) string {
	var pgErr *pgconn.PgError
	var opErr *net.OpError
	switch {
	case errors.As(ce, &pgErr):
		return pgErr.Message
	case errors.As(ce, &opErr) && opErr.Err != nil:
		return opErr.Err.Error()
	default:
		return ce.Unwrap().Error()
	}
}

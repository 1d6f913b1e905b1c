package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// explain says what went wrong in the user's terms: what to do for the
// errors a user can fix, and the library's or the database's own words, less
// their package prefixes (the command name already heads the line), for the
// rest.
func explain(err error) string {
	var ue usageError
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ue):
		return ue.msg
	case errors.Is(err, pgratelimit.ErrNotMigrated):
		return "the pgratelimit tables are not in this database (or not on its search_path): create them with 'pgratelimit migrate up'"
	case errors.As(err, &ce):
		return connectProblem(ce)
	case errors.Is(err, context.Canceled):
		return "interrupted"
	}
	return stripPrefixes(err.Error())
}

// stripPrefixes removes the "pgratelimit: " and "pgratelimit migrations: "
// with which the library starts its messages.
func stripPrefixes(s string) string {
	for _, p := range []string{"pgratelimit migrations: ", "pgratelimit: "} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}

// connectProblem describes a failed connection: where to, and why.
func connectProblem(ce *pgconn.ConnectError) string {
	where := "the database"
	if cfg := ce.Config; cfg != nil {
		addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		if strings.HasPrefix(cfg.Host, "/") {
			addr = fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
		}
		where = fmt.Sprintf("the database at %s (user %q, database %q)", addr, cfg.User, cfg.Database)
	}
	var pgErr *pgconn.PgError
	var opErr *net.OpError
	why := ""
	switch {
	case errors.Is(ce, context.DeadlineExceeded):
		why = "it did not answer in time"
	case errors.As(ce, &pgErr):
		why = pgErr.Message
	case errors.As(ce, &opErr) && opErr.Err != nil:
		why = opErr.Err.Error()
	default:
		why = ce.Unwrap().Error()
	}
	return fmt.Sprintf("could not connect to %s: %s", where, why)
}

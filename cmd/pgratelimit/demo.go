package main

import (
	"context"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/demo"
)

// runDemo is `pgratelimit demo`: package demo's app and page, on the
// database of --database-url or $DATABASE_URL, else a throwaway PostgreSQL.
func runDemo(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "demo")
	o := demo.Options{Stdout: c.stdout, Stderr: c.stderr}
	o.AddFlags(f.FlagSet)
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	o.DatabaseURL = f.databaseURL
	if o.DatabaseURL == "" {
		o.DatabaseURL = c.getenv("DATABASE_URL")
	}
	o.PrepareConn, o.Bound, o.Timeout = f.prepare, f.withTimeout, f.timeout
	if err := demo.Run(ctx, o); err != nil {
		return f.fail(err)
	}
	return exitOK
}

package main

import (
	"context"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench"
)

// runBench is `pgratelimit bench`: the load benchmark of package bench, its
// report on stdout (on stderr with --json, whose stdout is the report as
// JSON); exit status 2 when its exactness audit fails.
func runBench(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "bench")
	var o bench.Options
	o.AddFlags(f.FlagSet)
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	if _, err := o.Config(); err != nil {
		return f.fail(err)
	}
	pcfg, err := f.poolConfig()
	if err != nil {
		return f.fail(err)
	}
	rep, err := bench.Run(ctx, o, bench.Env{Pool: pcfg, Bound: f.withTimeout, Progress: c.stderr})
	if err != nil {
		return f.fail(err)
	}
	out := c.stdout
	if f.json {
		out = c.stderr
	}
	rep.WriteText(out, o.Duration, o.Cost)
	if f.json {
		f.printJSON(rep)
	}
	if !rep.OK() {
		return exitError
	}
	return exitOK
}

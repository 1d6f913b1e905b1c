package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// benchMore ends bench's help: --leases, and where its comparison with its
// peers is.
const benchMore = `--leases measures concurrency leases instead of checks: each worker acquires a lease of
--cost units of a key (a Semaphore of --lease-max units per key, --mode and --storage as
for checks) and releases it at once; the report gives acquire+release pairs per second,
their latency and the CPU time per pair, and audits that no key held more than its units.
The peer benchmark of a checkout (bench/peers.sh, make bench-peers) runs this benchmark
beside pgbench, rate-limiter-flexible and redis_rate, and its --leases beside a Redis
counting semaphore, on a throwaway PostgreSQL and Redis (see bench/README.md).
`

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
	cfg, err := o.Config()
	if err != nil {
		return f.fail(err)
	}
	pcfg, err := f.poolConfig()
	if err != nil {
		return f.fail(err)
	}
	// The library checks the run's limiter before the run touches the
	// database (New does not, nor does a pool before its first use).
	pool, err := pgxpool.NewWithConfig(ctx, pcfg.Copy())
	if err == nil {
		_, err = pgratelimit.New(pool, cfg)
		pool.Close()
	}
	if err != nil {
		return f.fail(configError(err))
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

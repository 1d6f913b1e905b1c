package main

import (
	"context"
	"math"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench"
	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench/peers"
)

// benchMore ends bench's help: where its comparison with its peers is.
const benchMore = `--leases measures concurrency leases instead of checks: each worker acquires a lease of
--cost units of a key (a Semaphore of --lease-max units per key, --mode and --storage as
for checks) and releases it at once; the report gives acquire+release pairs per second,
their latency and the CPU time per pair, and audits that no key held more than its units.
'pgratelimit bench peers' runs this benchmark beside pgbench, rate-limiter-flexible and
redis_rate, and its --leases beside a Redis counting semaphore, on a throwaway PostgreSQL
and Redis (bench/peers.sh, make bench-peers); 'pgratelimit bench peers --help' for its
arguments.
`

// runBench is `pgratelimit bench`: the load benchmark of package bench, its
// report on stdout (on stderr with --json, whose stdout is the report as
// JSON); exit status 2 when its exactness audit fails. `pgratelimit bench
// peers` is runPeers.
func runBench(ctx context.Context, c *cli, args []string) int {
	if len(args) > 0 && args[0] == "peers" {
		return runPeers(ctx, c, args[1:])
	}
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

// peersCommand is `pgratelimit bench peers`, which the command table lists
// under bench.
func peersCommand() command {
	return command{
		name:    "bench peers",
		args:    peers.Args,
		summary: "compare pgratelimit's bench with pgbench, rate-limiter-flexible and redis_rate, and its leases with a Redis counting semaphore, on a throwaway PostgreSQL and Redis, and write the tables to bench/results",
		more:    peers.Help(),
	}
}

// runPeers is `pgratelimit bench peers`: package peers, the peer benchmark
// that bench/peers.sh runs. Exit status 2 when a contender failed in every
// run of a scenario, or when interrupted.
func runPeers(ctx context.Context, c *cli, args []string) int {
	f := newFlagSet(c, peersCommand())
	var o peers.Options
	o.AddFlags(f.FlagSet)
	pos, err := f.parse(args, 0, math.MaxInt)
	if err != nil {
		return f.fail(err)
	}
	if err := o.FromEnv(c.getenv); err != nil {
		return f.fail(err)
	}
	o.Stdout, o.Stderr = c.stdout, c.stderr
	if err := peers.Run(ctx, o, pos); err != nil {
		return f.fail(err)
	}
	return exitOK
}

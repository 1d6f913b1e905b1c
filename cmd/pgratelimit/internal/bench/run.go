package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/bench/cpu"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Env is what a run needs from the command that starts it.
type Env struct {
	// Pool is the database's pool configuration (with the command's
	// connect timeout). Run sets its search_path to the scratch schema and
	// its size to the run's.
	Pool *pgxpool.Config
	// Bound bounds the database work of setting up and of removing the
	// scratch schema (the command's --timeout); nil: no bound.
	Bound func(context.Context) (context.Context, context.CancelFunc)
	// Progress receives the run's progress, redrawn each second, and the
	// first error a check returned, if any.
	Progress io.Writer
}

func (e Env) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.Bound == nil {
		return ctx, func() {}
	}
	return e.Bound(ctx)
}

// Run runs the load o describes in a scratch schema of its own, created
// (with the migrations, distributed on Citus, and prefilled when asked) and
// dropped again, after an interrupt too, and reports what it measured. Its
// errors about o are clierr.UsageErrors.
func Run(ctx context.Context, o Options, env Env) (rep Report, err error) {
	cfg, err := o.Config()
	if err != nil {
		return rep, err
	}
	s, err := createScratch(ctx, env, o, cfg)
	if err != nil {
		return rep, err
	}
	defer func() {
		if derr := s.remove(ctx); err == nil {
			err = derr
		}
	}()
	pool, err := pgxpool.NewWithConfig(ctx, env.Pool)
	if err != nil {
		return rep, err
	}
	defer pool.Close() // (closed already after the load: see measure)
	ch, err := newChecker(ctx, pool, cfg, o)
	if err != nil {
		return rep, err
	}
	defer ch.close(context.WithoutCancel(ctx))
	ld, used := measure(ctx, env, o, pool, ch)
	rep = ld.report(o, s.distributed, used)
	if e := ld.firstErr.Load(); e != nil {
		fmt.Fprintf(env.Progress, "first error: %s\n", e)
	}
	rep.Audit = ld.audit(cfg, o.Grants)
	if ch.audit != nil {
		rep.Audit = ch.audit()
	}
	if err := s.tableStats(ctx, &rep, o.Prefill > 0); err != nil {
		return rep, err
	}
	return rep, nil
}

// cpuUsed is the CPU time a run used: the client's (this process's) and
// the server's (on Citus, the coordinator's; 0: not readable).
type cpuUsed struct {
	client, server time.Duration
}

// measure runs the load between readings of the CPU time used so far, then
// closes the pool, so that the backends exit and flush their statistics.
func measure(ctx context.Context, env Env, o Options, pool *pgxpool.Pool, ch *checker) (*load, cpuUsed) {
	// What each key was allowed, for the audit. Touched before the CPU
	// baselines: ten million keys are 80 MB of page faults.
	ld := newLoad(o)
	server := serverCPU(ctx, pool)
	client := cpu.Self()
	stopProgress := ld.run(ctx, env.Progress, o, ch)
	used := cpuUsed{client: cpu.Self() - client}
	stopProgress()
	if server > 0 {
		used.server = serverCPU(ctx, pool) - server
	}
	pool.Close() // backends exit and flush their statistics
	return ld, used
}

// keyName is the name of key number k.
func keyName(k int) string { return "key-" + strconv.Itoa(k) }

// report sums up the load: throughput, latency percentiles, outcomes and
// CPU time per check.
func (ld *load) report(o Options, distributed bool, used cpuUsed) Report {
	all := slices.Concat(ld.lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	checks := ld.allowed.Load() + ld.denied.Load() // (with --leases, only the pairs are timed)
	rep := Report{
		Contender: o.contender(),
		Conc:      o.Concurrency, Keys: o.Keys, Secs: math.Round(o.Duration.Seconds()*10) / 10,
		ChecksPerSec: math.Round(float64(checks) / ld.elapsed.Seconds()),
		P50ms:        pct(0.50), P99ms: pct(0.99), MaxMs: pct(1),
		Allowed: ld.allowed.Load(), Denied: ld.denied.Load(), Errors: ld.errs.Load(), Audit: "ok",
		Limits: o.Limits, Commit: o.Commit, Distributed: distributed, Alerts: o.Alerts, PrefillRows: int64(o.Prefill),
	}
	if o.Leases {
		ld.leaseFigures(&rep, o, used)
	}
	if checks == 0 {
		return rep
	}
	rep.ClientUsPerCheck = usPer(used.client, checks)
	rep.ServerUsPerCheck = usPer(used.server, checks)
	return rep
}

// leaseFigures puts in rep the figures of a run with --leases: its
// acquire+release pairs (the acquisitions allowed, each released at once),
// their rate and the CPU time per pair.
func (ld *load) leaseFigures(rep *Report, o Options, used cpuUsed) {
	rep.Leases, rep.LeaseMax, rep.Pairs = true, o.LeaseMax, rep.Allowed
	rep.PairsPerSec = math.Round(float64(rep.Pairs) / ld.elapsed.Seconds())
	if rep.Pairs == 0 {
		return
	}
	rep.ClientUsPerPair = usPer(used.client, rep.Pairs)
	rep.ServerUsPerPair = usPer(used.server, rep.Pairs)
}

// usPer is d over n, in microseconds to a tenth.
func usPer(d time.Duration, n int64) float64 {
	return math.Round(10*float64(d.Microseconds())/float64(n)) / 10
}

// audit checks exactness: no key may have been given more than a bucket
// allows in the elapsed time (Capacity plus every refill, one more for the
// edges, plus its grants). It returns "ok", or what failed.
func (ld *load) audit(cfg pgratelimit.Config, grants int64) string {
	bound := cfg.Capacity
	if refills := int64(ld.elapsed/cfg.Interval) + 1; refills < (math.MaxInt64-cfg.Capacity-grants)/cfg.Refill {
		bound = cfg.Capacity + refills*cfg.Refill + grants
	}
	for k := range ld.allowedCost {
		if got := ld.allowedCost[k].Load(); got > bound {
			return fmt.Sprintf("FAILED: %s was allowed %d tokens, more than the %d a bucket allows in %s", keyName(k), got, bound, ld.elapsed.Round(time.Millisecond))
		}
	}
	return "ok"
}

// checker is what the workers call: one check of a key, through one limiter
// or, with --limits 2, two in one AllowAll; with --leases, an acquisition
// and, when acquired, its release (newLeaseChecker).
type checker struct {
	// check checks key number k and returns whether it was allowed.
	check func(ctx context.Context, k int, cost int64) (bool, error)
	// timeDenied says the latencies of denied checks are timed too (not
	// with --leases, whose latencies are the pairs').
	timeDenied bool
	// audit, if not nil, is the run's exactness audit, instead of the
	// buckets' (--leases).
	audit func() string
	// close closes the client the limiters or the semaphore run on (with
	// --coalesce-conns and --no-routing).
	close func(ctx context.Context)
}

func newChecker(ctx context.Context, pool *pgxpool.Pool, cfg pgratelimit.Config, o Options) (*checker, error) {
	client, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{CoalesceConns: o.CoalesceConns, DisableRouting: o.NoRouting})
	if err != nil {
		return nil, err
	}
	ch := &checker{close: func(ctx context.Context) { client.Close(ctx) }, timeDenied: !o.Leases}
	if o.Leases {
		err = ch.leases(client, o)
	} else {
		err = ch.limits(client, cfg, o)
	}
	if err != nil {
		ch.close(ctx)
		return nil, err
	}
	return ch, nil
}

// limits makes the checker's limiter, and with --limits 2 its daily one.
func (ch *checker) limits(client *pgratelimit.Client, cfg pgratelimit.Config, o Options) error {
	l, err := client.NewLimiter(cfg)
	if err != nil {
		return err
	}
	ch.check = func(ctx context.Context, k int, cost int64) (bool, error) {
		r, err := l.AllowN(ctx, keyName(k), cost)
		return r.Allowed, err
	}
	if o.Limits == 1 {
		return nil
	}
	dayCfg := cfg
	dayCfg.Prefix, dayCfg.Interval = "bench-day", 24*time.Hour
	day, err := client.NewLimiter(dayCfg)
	ch.check = func(ctx context.Context, k int, cost int64) (bool, error) {
		key := keyName(k)
		m, err := pgratelimit.AllowAll(ctx, l.Charge(key, cost), day.Charge(key, cost))
		return m.Allowed, err
	}
	return err
}

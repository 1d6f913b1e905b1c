// Command peers is the peer benchmark, which bench/peers.sh (make
// bench-peers) builds and runs; bench/README.md says what it measures and
// how. It starts a throwaway PostgreSQL and Redis on
// loopback, runs each contender on the same workload, one after the other,
// measures the CPU each check cost in the server and in the client with
// package cpu, prints a markdown table per scenario and writes every figure
// to a JSON file. Whatever happens (an error, Ctrl-C), it stops
// the servers and removes their files.
//
// Two workloads: checks of a rate limiter (pgratelimit's own load
// benchmark, `pgratelimit bench --json`, as the contenders coalesce,
// per-check and async, which is coalesce with --commit async; pgbench's
// scripts; rate-limiter-flexible; redis_rate), and concurrency leases,
// acquired and released at once (`pgratelimit bench --leases --json` as the
// contenders leases and leases-per-check; redis_sem, a Redis counting
// semaphore), whose unit is the acquire+release pair.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options is how the harness runs: its flags (AddFlags), its environment
// variables (FromEnv) and its output streams.
type Options struct {
	// Root is the repository's root: bench/pgbench and bench/rlf are read
	// from there (--root).
	Root string
	// PGBin holds PostgreSQL's binaries: initdb, pg_ctl, postgres,
	// pgbench, psql (--pgbin; default: those on PATH).
	PGBin string
	// BinDir holds the redisrate and redissem contenders, built by
	// peers.sh (--bindir; default ROOT/bench/.bin).
	BinDir string
	// Ours is the pgratelimit binary whose bench command the contenders
	// coalesce, per-check, async, leases and leases-per-check run (--ours;
	// default: BINDIR/pgratelimit, which peers.sh builds from this tree).
	Ours string

	// Runs is how many times each contender runs, interleaved; the tables
	// show medians ($RUNS, default 1).
	Runs int
	// Latency delays every response from PostgreSQL and Redis, through a
	// proxy ($LATENCY_MS).
	Latency time.Duration
	// OutDir is where the result files go ($BENCH_OUT, default
	// ROOT/bench/results).
	OutDir string
	// OursFlags are extra flags for the bench command of ours ($OURS_FLAGS).
	OursFlags []string
	// Workload is the workload the default scenarios run, and the one of a
	// scenario given as arguments: checks, leases, or both when empty
	// ($WORKLOAD; all: both).
	Workload string

	// Stdout receives the tables, Stderr the progress.
	Stdout, Stderr io.Writer
}

// Args is the harness's positional arguments, for its usage line.
const Args = "[CONC KEYS SECS logged|unlogged [contender ...]]"

// AddFlags defines the harness's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Root, "root", ".", "the repository's root (bench/pgbench and bench/rlf are read from there)")
	fs.StringVar(&o.PGBin, "pgbin", "", "PostgreSQL's binaries: initdb, pg_ctl, postgres, pgbench, psql (default: those on PATH)")
	fs.StringVar(&o.BinDir, "bindir", "", "where peers.sh put the redisrate and redissem contenders (default ROOT/bench/.bin)")
	fs.StringVar(&o.Ours, "ours", "", "the pgratelimit binary that the contenders coalesce, per-check, async, leases and leases-per-check run (default: BINDIR/pgratelimit)")
}

// FromEnv reads RUNS, LATENCY_MS, BENCH_OUT, OURS_FLAGS and WORKLOAD with
// getenv.
func (o *Options) FromEnv(getenv func(string) string) error {
	envInt := func(name string, def int) (int, error) {
		if v := getenv(name); v != "" {
			return strconv.Atoi(v)
		}
		return def, nil
	}
	runs, err := envInt("RUNS", 1)
	if err != nil || runs < 1 {
		return usagef("RUNS must be a positive integer, got %q", getenv("RUNS"))
	}
	latency, err := envInt("LATENCY_MS", 0)
	if err != nil || latency < 0 {
		return usagef("LATENCY_MS must be a non-negative integer, got %q", getenv("LATENCY_MS"))
	}
	o.Runs, o.Latency = runs, time.Duration(latency)*time.Millisecond
	o.OutDir = getenv("BENCH_OUT")
	o.OursFlags = strings.Fields(getenv("OURS_FLAGS"))
	switch w := getenv("WORKLOAD"); w {
	case "", "all":
		o.Workload = ""
	case checks, leases:
		o.Workload = w
	default:
		return usagef("WORKLOAD must be checks, leases or all, got %q", w)
	}
	return nil
}

// Help describes the arguments, the contenders and the environment, for
// the command's --help.
func Help() string {
	return fmt.Sprintf(`With no arguments, it runs every contender in the default scenarios:
%sContenders of checks: %s
  (ours = coalesce per-check; async = coalesce with --commit async, also called
  ours_async; pgbench = tx pipelined upsert)
Contenders of leases (a lease of 1 of %d units per key, acquired and released at once):
  %s  (ours_leases = leases leases-per-check)
A scenario given as arguments runs the contenders named (all, or WORKLOAD's, when none
is), once for each workload among them.
Environment: RUNS=N (medians of N interleaved runs), LATENCY_MS=N (every response
from PostgreSQL and Redis delayed N ms), BENCH_OUT=DIR (result files; default
bench/results), OURS_FLAGS (extra flags for ours' bench command), WORKLOAD=checks,
leases or all (the default: both).
Run it through bench/peers.sh (make bench-peers), which installs and builds what it needs.
`, describeScenarios(defaultScenarios("")), strings.Join(contenderNames(checks), " "), leaseMax, strings.Join(contenderNames(leases), " "))
}

// Run runs the contenders args name (all of them by default) in the
// scenario args give (the default scenarios without arguments), prints the
// tables and writes the result files. Its errors about args are
// usageErrors; it fails when a contender failed in every run of a
// scenario, and returns ctx's error when interrupted (SIGHUP too), after
// stopping the servers and writing what was measured.
func Run(ctx context.Context, o Options, args []string) error {
	scenarios, cs, err := parseArgs(args, o.Workload)
	if err != nil {
		return err
	}
	if o.BinDir == "" {
		o.BinDir = filepath.Join(o.Root, "bench", ".bin")
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.Root, "bench", "results")
	}
	if o.Runs < 1 {
		o.Runs = 1
	}
	ours, err := o.oursBinary()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	// The servers and the contenders run in process groups of their own, so
	// a terminal's Ctrl-C reaches only this process, which then stops them.
	defer context.AfterFunc(ctx, func() {
		fmt.Fprintln(o.Stderr, "\npeers: interrupted: stopping the run, the servers and removing their files")
	})()
	e := &env{root: o.Root, bindir: o.BinDir, pgbin: o.PGBin, ours: ours, oursBin: o.Ours, oursFlags: o.OursFlags,
		latency: o.Latency, stderr: o.Stderr}
	rep := newReport(o)
	runErr := e.runAll(ctx, o, rep, scenarios, cs)
	return o.finish(ctx, rep, runErr)
}

// oursBinary is Options.Ours, else the pgratelimit in BinDir.
func (o Options) oursBinary() (string, error) {
	if o.Ours != "" {
		return o.Ours, nil
	}
	return filepath.Abs(filepath.Join(o.BinDir, "pgratelimit"))
}

// finish writes the result files, if anything was measured, and returns
// the run's outcome.
func (o Options) finish(ctx context.Context, rep *report, runErr error) error {
	rep.Finished = time.Now().UTC().Format(time.RFC3339)
	rep.Interrupted = ctx.Err() != nil
	if len(rep.Scenarios) > 0 {
		paths, err := rep.write(o.OutDir)
		if err != nil {
			return errors.Join(runErr, fmt.Errorf("writing the results: %w", err))
		}
		fmt.Fprintf(o.Stdout, "\nResults: %s\n", strings.Join(paths, ", "))
	}
	switch {
	case runErr != nil:
		return runErr
	case ctx.Err() != nil:
		return ctx.Err()
	case rep.failed():
		return errors.New("a contender failed in every run of a scenario: see the notes under its table")
	}
	return nil
}

// runAll starts the servers, runs every contender of each scenario's
// workload runs times in it, prints each scenario's table, and stops the
// servers.
func (e *env) runAll(ctx context.Context, o Options, rep *report, scenarios []scenario, cs []contender) error {
	defer e.stop()
	if err := e.start(ctx, scenarios, cs); err != nil {
		return err
	}
	rep.Machine = e.machine()
	for _, c := range cs {
		rep.Contenders[c.Name] = c.label(e)
	}
	p := progress{total: 0}
	for _, s := range scenarios {
		p.total += o.Runs * len(contendersOf(cs, s.Workload))
	}
	for _, s := range scenarios {
		sr := e.runScenario(ctx, o, s, contendersOf(cs, s.Workload), &p)
		rep.Scenarios = append(rep.Scenarios, sr)
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintln(o.Stdout)
		fmt.Fprint(o.Stdout, sr.markdown(o.Runs, rep.LatencyMS))
	}
	return nil
}

// progress counts the runs done, of total, for the progress lines.
type progress struct{ n, total int }

// runScenario runs each of cs runs times in s, interleaved, and returns
// the runs and their medians.
func (e *env) runScenario(ctx context.Context, o Options, s scenario, cs []contender, p *progress) scenarioReport {
	sr := scenarioReport{Scenario: s}
	for _, c := range cs {
		sr.Results = append(sr.Results, contenderReport{Contender: c.Name, Label: c.label(e)})
	}
	unit := s.unit()
	for r := 1; r <= o.Runs && ctx.Err() == nil; r++ {
		for i, c := range cs {
			if ctx.Err() != nil {
				break
			}
			p.n++
			fmt.Fprintf(o.Stderr, "[%d/%d] %s: %s (run %d of %d) ... ", p.n, p.total, s.short(), c.Name, r, o.Runs)
			res := e.measure(ctx, c, s)
			res.Run = r
			if res.Error != "" {
				fmt.Fprintf(o.Stderr, "FAILED: %s\n", res.Error)
			} else {
				fmt.Fprintf(o.Stderr, "%s %ss/s, p99 %.2f ms, %.1f + %.1f µs/%s\n",
					thousands(res.ChecksPerSec), unit, res.P99ms, res.ServerUsPerCheck, res.ClientUsPerCheck, unit)
			}
			sr.Results[i].Runs = append(sr.Results[i].Runs, res)
		}
	}
	for i := range sr.Results {
		sr.Results[i].Median = median(sr.Results[i].Runs)
	}
	return sr
}

// The workloads: checks of a rate limiter, or concurrency leases, each
// acquired and released at once (the unit of a result is then the pair),
// of leaseMax units per key.
const (
	checks   = "checks"
	leases   = "leases"
	leaseMax = 8
)

// scenario is one workload of checks or leases (Workload): Conc checks (or
// acquire+release pairs of leases of LeaseMax units per key) in flight on
// Keys keys for Secs seconds, on logged or unlogged tables.
type scenario struct {
	Workload string `json:"workload"`
	Conc     int    `json:"conc"`
	Keys     int    `json:"keys"`
	Secs     int    `json:"secs"`
	Tables   string `json:"tables"` // logged or unlogged
	LeaseMax int    `json:"lease_max,omitempty"`
}

// defaultScenarios of workload (both when ""): checks on many keys and on
// one hot key on logged tables, and a larger crowd on unlogged tables; and
// leases on many keys and one hot key. With every contender at 8 s each,
// about 3 1/2 minutes of runs of checks and 1 of leases.
func defaultScenarios(workload string) []scenario {
	var ss []scenario
	if workload != leases {
		ss = append(ss,
			scenario{Workload: checks, Conc: 64, Keys: 10000, Secs: 8, Tables: "logged"},
			scenario{Workload: checks, Conc: 64, Keys: 1, Secs: 8, Tables: "logged"},
			scenario{Workload: checks, Conc: 256, Keys: 10000, Secs: 8, Tables: "unlogged"})
	}
	if workload != checks {
		ss = append(ss,
			scenario{Workload: leases, Conc: 64, Keys: 10000, Secs: 8, Tables: "logged", LeaseMax: leaseMax},
			scenario{Workload: leases, Conc: 64, Keys: 1, Secs: 8, Tables: "logged", LeaseMax: leaseMax})
	}
	return ss
}

// String describes the scenario for the tables: "64 in flight, 10,000 keys,
// 8 s, logged tables", and for leases "leases of 1 of 8 units per key,
// acquired and released: 64 in flight, ...".
func (s scenario) String() string {
	keys := thousands(float64(s.Keys)) + " keys"
	if s.Keys == 1 {
		keys = "one hot key"
	}
	what := ""
	if s.Workload == leases {
		what = fmt.Sprintf("Leases of 1 of %d units per key, acquired and released: ", s.LeaseMax)
	}
	return fmt.Sprintf("%s%d in flight, %s, %d s, %s tables", what, s.Conc, keys, s.Secs, s.Tables)
}

func (s scenario) short() string {
	return fmt.Sprintf("%d %d %d %s %s", s.Conc, s.Keys, s.Secs, s.Tables, s.Workload)
}

// unit is what a result counts: checks, or acquire+release pairs.
func (s scenario) unit() string {
	if s.Workload == leases {
		return "pair"
	}
	return "check"
}

func describeScenarios(ss []scenario) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "  %-29s (%s)\n", s.short(), s)
	}
	return b.String()
}

// parseArgs reads CONC KEYS SECS logged|unlogged [contender ...]: none of
// them for the default scenarios of workload and their contenders. A
// scenario given runs for each workload (workload, or both when "") that
// has contenders among those named (all when none is).
func parseArgs(args []string, workload string) ([]scenario, []contender, error) {
	if len(args) == 0 {
		return defaultScenarios(workload), contendersOfWorkload(workload), nil
	}
	if len(args) < 4 {
		return nil, nil, usagef("give all four of CONC KEYS SECS logged|unlogged, or none")
	}
	var s scenario
	var err error
	for i, p := range []*int{&s.Conc, &s.Keys, &s.Secs} {
		if *p, err = strconv.Atoi(args[i]); err != nil || *p < 1 {
			return nil, nil, usagef("%q: CONC, KEYS and SECS must be positive integers", args[i])
		}
	}
	s.Tables = args[3]
	if s.Tables != "logged" && s.Tables != "unlogged" {
		return nil, nil, usagef("%q: the fourth argument is logged or unlogged", s.Tables)
	}
	cs := contendersOfWorkload(workload)
	if len(args) > 4 {
		if cs, err = pickContenders(args[4:], workload); err != nil {
			return nil, nil, err
		}
	}
	var ss []scenario
	for _, w := range []string{checks, leases} {
		if len(contendersOf(cs, w)) > 0 {
			s.Workload, s.LeaseMax = w, 0
			if w == leases {
				s.LeaseMax = leaseMax
			}
			ss = append(ss, s)
		}
	}
	return ss, cs, nil
}

// pickContenders returns the contenders named, each once, in the order
// named: ours is coalesce and per-check, ours_async is async (the name
// ../shared/bench/peers.sh gives it), pgbench is tx, pipelined and
// upsert, ours_leases is leases and leases-per-check. With a workload, they
// must include one of its.
func pickContenders(names []string, workload string) ([]contender, error) {
	var cs []contender
	seen := map[string]bool{}
	for _, a := range names {
		group := []string{a}
		switch a {
		case "ours":
			group = []string{"coalesce", "per-check"}
		case "ours_async":
			group = []string{"async"}
		case "pgbench":
			group = []string{"tx", "pipelined", "upsert"}
		case "ours_leases":
			group = []string{"leases", "leases-per-check"}
		}
		for _, n := range group {
			c, ok := contenderByName(n)
			if !ok {
				return nil, usagef("unknown contender %q (contenders: %s)", n, strings.Join(contenderNames(""), " "))
			}
			if !seen[n] {
				seen[n] = true
				cs = append(cs, c)
			}
		}
	}
	if workload != "" && len(contendersOf(cs, workload)) == 0 {
		return nil, usagef("WORKLOAD=%s, but no contender of it is named (contenders of %s: %s)", workload, workload, strings.Join(contenderNames(workload), " "))
	}
	return cs, nil
}

// thousands formats n rounded to an integer with commas: 12,345.
func thousands(n float64) string {
	s := strconv.FormatInt(int64(n+0.5), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

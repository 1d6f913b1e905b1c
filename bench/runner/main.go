// Command runner is the harness of the peer benchmark (bench/peers.sh builds and
// starts it; see bench/README.md). It starts a throwaway PostgreSQL and Redis on
// loopback, runs each contender on the same workload, one after the other, measures
// the CPU each check cost in the server and in the client, prints a markdown table per
// scenario and writes every figure to a JSON file. Whatever happens (an error, Ctrl-C),
// it stops the servers and removes their files.
//
// Usage: runner [-root DIR] [-pgbin DIR] [CONC KEYS SECS logged|unlogged [contender ...]]
//
// Environment: RUNS (runs per contender, interleaved; the tables show medians),
// LATENCY_MS (a delay added to every response from PostgreSQL and Redis),
// BENCH_OUT (where the result files go; default bench/results).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run())
}

func usage() {
	fmt.Fprintf(os.Stderr, `usage: bench/peers.sh [CONC KEYS SECS logged|unlogged [contender ...]]

With no arguments, runs every contender in the default scenarios:
%s
Contenders: %s
  (ours = coalesce per-check; pgbench = tx pipelined upsert)
Environment: RUNS=N (medians of N interleaved runs), LATENCY_MS=N (every response
from PostgreSQL and Redis delayed N ms), BENCH_OUT=DIR (result files; default bench/results).
`, describeScenarios(defaultScenarios), strings.Join(contenderNames(), " "))
}

func run() int {
	root := flag.String("root", ".", "the repository's root")
	pgbin := flag.String("pgbin", "", "PostgreSQL's server binaries (initdb, pg_ctl, pgbench, psql)")
	bindir := flag.String("bindir", "", "where peers.sh put the built binaries (default ROOT/bench/.bin)")
	flag.Usage = usage
	flag.Parse()
	if *bindir == "" {
		*bindir = filepath.Join(*root, "bench", ".bin")
	}
	scenarios, contenders, err := parseArgs(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		usage()
		return 2
	}
	runs, err := envInt("RUNS", 1)
	if err != nil || runs < 1 {
		fmt.Fprintln(os.Stderr, "peers: RUNS must be a positive integer")
		return 2
	}
	latencyMS, err := envInt("LATENCY_MS", 0)
	if err != nil || latencyMS < 0 {
		fmt.Fprintln(os.Stderr, "peers: LATENCY_MS must be a non-negative integer")
		return 2
	}
	outDir := os.Getenv("BENCH_OUT")
	if outDir == "" {
		outDir = filepath.Join(*root, "bench", "results")
	}

	// The first SIGINT or SIGTERM cancels the run; the servers and the contenders run in
	// process groups of their own, so a terminal's Ctrl-C reaches only this process, which
	// then stops them. Later signals are ignored until the cleanup is done.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for s := range sigs {
			if ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "\npeers: %v: stopping the run, the servers and removing their files\n", s)
			}
			cancel()
		}
	}()

	e := &env{root: *root, bindir: *bindir, pgbin: *pgbin, latency: time.Duration(latencyMS) * time.Millisecond}
	rep := &report{
		Started:    time.Now().UTC().Format(time.RFC3339),
		Runs:       runs,
		LatencyMS:  latencyMS,
		Scenarios:  make([]scenarioReport, 0, len(scenarios)),
		Contenders: map[string]string{},
	}
	code := func() int {
		defer e.stop()
		if err := e.start(ctx, scenarios, contenders); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			return 1
		}
		rep.Machine = e.machine()
		for _, c := range contenders {
			rep.Contenders[c.Name] = c.label(e)
		}
		total := len(scenarios) * runs * len(contenders)
		n := 0
		for _, s := range scenarios {
			sr := scenarioReport{Scenario: s}
			byName := map[string]*contenderReport{}
			for _, c := range contenders {
				sr.Results = append(sr.Results, contenderReport{Contender: c.Name, Label: c.label(e)})
			}
			for i := range sr.Results {
				byName[sr.Results[i].Contender] = &sr.Results[i]
			}
			for r := 1; r <= runs; r++ {
				for _, c := range contenders {
					if ctx.Err() != nil {
						break
					}
					n++
					fmt.Fprintf(os.Stderr, "[%d/%d] %s: %s (run %d of %d) ... ", n, total, s.short(), c.Name, r, runs)
					res := e.measure(ctx, c, s)
					res.Run = r
					if res.Error != "" {
						fmt.Fprintf(os.Stderr, "FAILED: %s\n", res.Error)
					} else {
						fmt.Fprintf(os.Stderr, "%s checks/s, p99 %.2f ms, %.1f + %.1f µs/check\n",
							thousands(res.ChecksPerSec), res.P99ms, res.ServerUsPerCheck, res.ClientUsPerCheck)
					}
					cr := byName[c.Name]
					cr.Runs = append(cr.Runs, res)
				}
			}
			for i := range sr.Results {
				sr.Results[i].Median = median(sr.Results[i].Runs)
			}
			rep.Scenarios = append(rep.Scenarios, sr)
			if ctx.Err() != nil {
				break
			}
			fmt.Println()
			fmt.Print(sr.markdown(runs, latencyMS))
		}
		if ctx.Err() != nil {
			return 130
		}
		return 0
	}()
	rep.Finished = time.Now().UTC().Format(time.RFC3339)
	rep.Interrupted = code == 130
	if len(rep.Scenarios) > 0 {
		paths, err := rep.write(outDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "peers: writing the results:", err)
			if code == 0 {
				code = 1
			}
		} else {
			fmt.Printf("\nResults: %s\n", strings.Join(paths, ", "))
		}
	}
	if code == 0 && rep.failed() {
		code = 1
	}
	return code
}

func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	return strconv.Atoi(v)
}

type scenario struct {
	Conc   int    `json:"conc"`
	Keys   int    `json:"keys"`
	Secs   int    `json:"secs"`
	Tables string `json:"tables"` // logged or unlogged
}

// defaultScenarios: many keys and one hot key on logged tables, and a larger crowd on
// unlogged tables. With every contender at 8 s each, about 3 1/2 minutes of runs.
var defaultScenarios = []scenario{
	{Conc: 64, Keys: 10000, Secs: 8, Tables: "logged"},
	{Conc: 64, Keys: 1, Secs: 8, Tables: "logged"},
	{Conc: 256, Keys: 10000, Secs: 8, Tables: "unlogged"},
}

func (s scenario) String() string {
	keys := thousands(float64(s.Keys)) + " keys"
	if s.Keys == 1 {
		keys = "one hot key"
	}
	return fmt.Sprintf("%d in flight, %s, %d s, %s tables", s.Conc, keys, s.Secs, s.Tables)
}

func (s scenario) short() string {
	return fmt.Sprintf("%d %d %d %s", s.Conc, s.Keys, s.Secs, s.Tables)
}

func describeScenarios(ss []scenario) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "  %-22s (%s)\n", s.short(), s)
	}
	return b.String()
}

func parseArgs(args []string) ([]scenario, []contender, error) {
	if len(args) == 0 {
		return defaultScenarios, allContenders, nil
	}
	if len(args) < 4 {
		return nil, nil, errors.New("give all four of CONC KEYS SECS logged|unlogged, or none")
	}
	var s scenario
	var err error
	for i, p := range []*int{&s.Conc, &s.Keys, &s.Secs} {
		if *p, err = strconv.Atoi(args[i]); err != nil || *p < 1 {
			return nil, nil, fmt.Errorf("%q: CONC, KEYS and SECS must be positive integers", args[i])
		}
	}
	s.Tables = args[3]
	if s.Tables != "logged" && s.Tables != "unlogged" {
		return nil, nil, fmt.Errorf("%q: the fourth argument is logged or unlogged", s.Tables)
	}
	if len(args) == 4 {
		return []scenario{s}, allContenders, nil
	}
	var cs []contender
	seen := map[string]bool{}
	for _, a := range args[4:] {
		names := []string{a}
		switch a {
		case "ours":
			names = []string{"coalesce", "per-check"}
		case "pgbench":
			names = []string{"tx", "pipelined", "upsert"}
		}
		for _, n := range names {
			c, ok := contenderByName(n)
			if !ok {
				return nil, nil, fmt.Errorf("unknown contender %q", n)
			}
			if !seen[n] {
				seen[n] = true
				cs = append(cs, c)
			}
		}
	}
	return []scenario{s}, cs, nil
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

package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func names(cs []contender) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}

func TestParseArgs(t *testing.T) {
	ss, cs, err := parseArgs(nil, "")
	require.NoError(t, err)
	require.Equal(t, defaultScenarios(""), ss)
	require.Len(t, ss, 5, "three of checks, two of leases")
	require.Len(t, cs, len(contenders()))
	ss, cs, err = parseArgs(nil, leases)
	require.NoError(t, err)
	require.Equal(t, []scenario{{Workload: leases, Conc: 64, Keys: 10000, Secs: 8, Tables: "logged", LeaseMax: 8},
		{Workload: leases, Conc: 64, Keys: 1, Secs: 8, Tables: "logged", LeaseMax: 8}}, ss)
	require.Equal(t, []string{"leases", "leases-per-check", "redis_sem"}, names(cs))
	ss, _, err = parseArgs(nil, checks)
	require.NoError(t, err)
	require.Len(t, ss, 3)

	ss, cs, err = parseArgs([]string{"1", "10000", "8", "logged", "ours", "redis_rate", "coalesce"}, "")
	require.NoError(t, err)
	require.Equal(t, []scenario{{Workload: checks, Conc: 1, Keys: 10000, Secs: 8, Tables: "logged"}}, ss)
	require.Equal(t, []string{"coalesce", "per-check", "redis_rate"}, names(cs), "ours is coalesce and per-check, each once")

	_, cs, err = parseArgs([]string{"64", "10000", "8", "logged", "ours_async", "async", "ours"}, "")
	require.NoError(t, err)
	require.Equal(t, []string{"async", "coalesce", "per-check"}, names(cs), "ours_async is async, ../shared/bench/peers.sh's name for it")

	// A scenario given runs for the workloads of the contenders named.
	ss, cs, err = parseArgs([]string{"64", "1", "8", "logged", "ours_leases", "redis_sem", "coalesce"}, "")
	require.NoError(t, err)
	require.Equal(t, []scenario{{Workload: checks, Conc: 64, Keys: 1, Secs: 8, Tables: "logged"},
		{Workload: leases, Conc: 64, Keys: 1, Secs: 8, Tables: "logged", LeaseMax: 8}}, ss)
	require.Equal(t, []string{"leases", "leases-per-check", "redis_sem", "coalesce"}, names(cs))
	ss, cs, err = parseArgs([]string{"64", "1", "8", "logged"}, leases)
	require.NoError(t, err)
	require.Len(t, ss, 1)
	require.Equal(t, leases, ss[0].Workload)
	require.Equal(t, []string{"leases", "leases-per-check", "redis_sem"}, names(cs))

	for _, tc := range []struct{ args, workload, want string }{
		{"1 2", "", "give all four of CONC KEYS SECS logged|unlogged, or none"},
		{"0 1 8 logged", "", `"0": CONC, KEYS and SECS must be positive integers`},
		{"1 1 8 durable", "", `"durable": the fourth argument is logged or unlogged`},
		{"1 1 8 logged bogus", "", `unknown contender "bogus"`},
		{"64 1 8 unlogged rlf x", "", `unknown contender "x"`},
		{"64 1 8 logged redis_rate", leases, "WORKLOAD=leases, but no contender of it is named (contenders of leases: leases leases-per-check redis_sem)"},
	} {
		_, _, err := parseArgs(strings.Fields(tc.args), tc.workload)
		var ue usageError
		require.True(t, errors.As(err, &ue), "%s: %v", tc.args, err)
		require.Contains(t, ue.Msg, tc.want, tc.args)
	}
}

// The contenders of pgratelimit run its bench command: async is coalesce
// with --commit async, before OURS_FLAGS; on unlogged tables, with
// ephemeral storage.
func TestOursCommands(t *testing.T) {
	e := &env{ours: "/bin/pgratelimit", pgURL: "postgres://x/y", oursFlags: []string{"--coalesce-conns", "4"}}
	args := func(name string, s scenario) string {
		c, ok := contenderByName(name)
		require.True(t, ok, name)
		cmd, _ := c.command(context.Background(), e, s, t.TempDir())
		return strings.Join(cmd.Args, " ")
	}
	logged := scenario{Conc: 64, Keys: 10000, Secs: 8, Tables: "logged"}
	require.Equal(t, "/bin/pgratelimit bench --database-url postgres://x/y --concurrency 64 --keys 10000 --duration 8s --storage durable --mode coalesce --json --commit async --coalesce-conns 4",
		args("async", logged))
	require.Equal(t, "/bin/pgratelimit bench --database-url postgres://x/y --concurrency 64 --keys 10000 --duration 8s --storage durable --mode per-check --json --coalesce-conns 4",
		args("per-check", logged))
	require.Contains(t, args("async", scenario{Conc: 256, Keys: 10000, Secs: 8, Tables: "unlogged"}), "--storage ephemeral --mode coalesce --json --commit async")
	leased := scenario{Workload: leases, Conc: 64, Keys: 1, Secs: 8, Tables: "logged", LeaseMax: 8}
	require.Equal(t, "/bin/pgratelimit bench --database-url postgres://x/y --concurrency 64 --keys 1 --duration 8s --storage durable --mode coalesce --json --leases --lease-max 8 --coalesce-conns 4",
		args("leases", leased))
	require.Contains(t, args("leases-per-check", leased), "--mode per-check --json --leases --lease-max 8")
	e.bindir, e.redisAddr = "/bin", "127.0.0.1:6379"
	require.Equal(t, "/bin/redissem 64 1 8 8", args("redis_sem", leased))
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{"RUNS": "3", "LATENCY_MS": "2", "BENCH_OUT": "/tmp/x", "OURS_FLAGS": "--coalesce-conns 4", "WORKLOAD": "leases"}
	var o Options
	require.NoError(t, o.FromEnv(func(k string) string { return env[k] }))
	require.Equal(t, leases, o.Workload)
	require.Equal(t, 3, o.Runs)
	require.Equal(t, "2ms", o.Latency.String())
	require.Equal(t, "/tmp/x", o.OutDir)
	require.Equal(t, []string{"--coalesce-conns", "4"}, o.OursFlags)
	env["RUNS"] = "0"
	require.ErrorContains(t, o.FromEnv(func(k string) string { return env[k] }), "RUNS must be a positive integer")
	env["RUNS"], env["LATENCY_MS"] = "", "-1"
	require.ErrorContains(t, o.FromEnv(func(k string) string { return env[k] }), "LATENCY_MS must be a non-negative integer")
	env["LATENCY_MS"], env["WORKLOAD"] = "", "all"
	require.NoError(t, o.FromEnv(func(k string) string { return env[k] }))
	require.Empty(t, o.Workload, "both")
	env["WORKLOAD"] = "locks"
	require.ErrorContains(t, o.FromEnv(func(k string) string { return env[k] }), `WORKLOAD must be checks, leases or all, got "locks"`)
}

// The lines of the contenders of leases count pairs: pgratelimit bench
// --leases's Report and redissem's line.
func TestParseLeaseLine(t *testing.T) {
	line, err := json.Marshal(oursReport{Contender: "ours-coalesce-durable-leases", ChecksPerSec: 9000, P50ms: 2, P99ms: 5, MaxMs: 9,
		Allowed: 40000, Denied: 32000, Audit: "ok", Leases: true, LeaseMax: 8, Pairs: 40000, PairsPerSec: 5000})
	require.NoError(t, err)
	o, err := parseLeaseLine("progress\n" + string(line) + "\n")
	require.NoError(t, err)
	require.Equal(t, outcome{Checks: 40000, Denied: 32000, ElapsedS: 8, ChecksPerSec: 5000, P50ms: 2, P99ms: 5,
		Extra: map[string]any{"audit": "ok", "max_ms": 9.0, "denied": int64(32000)}}, o)

	o, err = parseLeaseLine(`{"audit":"ok","conc":64,"contender":"redis_sem","denied":45132,"elapsed_s":8.0008,"errors":0,"keys":1,"lease_max":8,"p50_ms":1.869,"p99_ms":6.161,"pairs":59376,"pairs_per_sec":7421.3,"secs":8}`)
	require.NoError(t, err)
	require.Equal(t, outcome{Checks: 59376, Denied: 45132, ElapsedS: 8.0008, ChecksPerSec: 7421.3, P50ms: 1.869, P99ms: 6.161,
		Extra: map[string]any{"audit": "ok", "max_ms": 0.0, "denied": int64(45132)}}, o)
	_, err = parseLeaseLine(`{"contender":"redis_rate","checks":80000,"checks_per_sec":9987.5}`)
	require.ErrorContains(t, err, "no pairs")
}

// The line pgratelimit bench --json prints (a Report of the CLI's
// internal/bench) is read for its figures and pgratelimit's own.
func TestParseResultLineOurs(t *testing.T) {
	line := `{"contender":"ours-coalesce-durable","conc":64,"keys":10000,"secs":8,"checks_per_sec":5000,"p50_ms":1.5,"p99_ms":4,"max_ms":9,` +
		`"allowed":39000,"denied":1000,"errors":2,"audit":"ok","hot_update_ratio":0.99,"updates":40000,"limits":1,"commit":"sync",` +
		`"distributed":false,"alerts":false,"events":0,"client_us_per_check":40,"server_us_per_check":130,"leases":false}`
	o, err := parseResultLine("progress\n" + line + "\n")
	require.NoError(t, err)
	require.Equal(t, outcome{Checks: 40000, Errors: 2, ElapsedS: 8, ChecksPerSec: 5000, P50ms: 1.5, P99ms: 4,
		Extra: map[string]any{"audit": "ok", "hot_update_ratio": 0.99, "updates": int64(40000), "max_ms": 9.0,
			"allowed": int64(39000), "denied": int64(1000)}}, o)
}

// redisrate's and rlf/bench.js's lines count their checks and time.
func TestParseResultLineOthers(t *testing.T) {
	o, err := parseResultLine(`{"contender":"redis_rate","conc":64,"keys":1,"secs":8,"checks":80000,"elapsed_s":8.01,"checks_per_sec":9987.5,"p50_ms":0.5,"p99_ms":2.5,"errors":0}`)
	require.NoError(t, err)
	require.Equal(t, outcome{Checks: 80000, ElapsedS: 8.01, ChecksPerSec: 9987.5, P50ms: 0.5, P99ms: 2.5}, o)
	_, err = parseResultLine("no json here\n")
	require.ErrorContains(t, err, "no JSON result line")
}

func TestParsePgbench(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "pgbench_log")
	var log strings.Builder
	for i := range 100 {
		log.WriteString("0 " + itoa(i) + " " + itoa(1000+10*i) + " 0 1700000000 0\n")
	}
	require.NoError(t, os.WriteFile(prefix+".123", []byte(log.String()), 0o644))
	stdout := `pgbench (15.14 (Debian 15.14-0+deb12u1))
transaction type: tx.sql
number of transactions actually processed: 80000
number of failed transactions: 3 (0.004%)
latency average = 6.2 ms
tps = 10000.5 (without initial connection time)
`
	o, err := parsePgbench(stdout, prefix)
	require.NoError(t, err)
	require.Equal(t, int64(80000), o.Checks)
	require.Equal(t, int64(3), o.Errors)
	require.Equal(t, 10000.5, o.ChecksPerSec)
	require.InDelta(t, 8, o.ElapsedS, 0.01)
	require.Equal(t, 1.5, o.P50ms)
	require.Equal(t, 1.99, o.P99ms)

	_, err = parsePgbench("connection refused\n", prefix)
	require.ErrorContains(t, err, "pgbench printed no result")
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestReport(t *testing.T) {
	runs := []result{
		{Run: 1, Checks: 100, ChecksPerSec: 1000, P99ms: 2, ServerUsPerCheck: 10, OtherLoad: 0.01},
		{Run: 2, Checks: 300, ChecksPerSec: 3000, P99ms: 4, ServerUsPerCheck: 30, OtherLoad: 0.03},
		{Run: 3, Error: "exit status 1"},
	}
	m := median(runs)
	require.Equal(t, int64(200), m.Checks)
	require.Equal(t, 2000.0, m.ChecksPerSec)
	require.Nil(t, median(runs[2:]))

	sr := scenarioReport{Scenario: scenario{Conc: 64, Keys: 10000, Secs: 8, Tables: "logged"},
		Results: []contenderReport{{Contender: "tx", Label: "pgbench: tx", Median: m, Runs: runs}}}
	md := sr.markdown(3, 0)
	require.Contains(t, md, "### 64 in flight, 10,000 keys, 8 s, logged tables\n")
	require.Contains(t, md, "| pgbench: tx | 2,000 |")
	require.Contains(t, md, "- tx: 1 of 3 runs failed and are left out\n")
	require.Contains(t, md, "| contender | checks/s | p50 ms | p99 ms | server µs/check | client µs/check |\n|---|---:|---:|---:|---:|---:|\n")

	lm := &result{Checks: 40000, Denied: 80000, ElapsedS: 8, ChecksPerSec: 5000, P50ms: 2, P99ms: 5, ServerUsPerCheck: 60, ClientUsPerCheck: 40}
	sr = scenarioReport{Scenario: scenario{Workload: leases, Conc: 64, Keys: 1, Secs: 8, Tables: "logged", LeaseMax: 8},
		Results: []contenderReport{{Contender: "redis_sem", Label: "Redis semaphore", Median: lm, Runs: []result{*lm}},
			{Contender: "leases", Label: "pgratelimit", Runs: []result{{Run: 1, Error: "exit status 2"}}}}}
	md = sr.markdown(1, 0)
	require.Contains(t, md, "### Leases of 1 of 8 units per key, acquired and released: 64 in flight, one hot key, 8 s, logged tables\n\n"+
		"| contender | pairs/s | p50 ms | p99 ms | server µs/pair | client µs/pair | denied/s |\n|---|---:|---:|---:|---:|---:|---:|\n"+
		"| Redis semaphore | 5,000 | 2.00 | 5.00 | 60.0 | 40.0 | 10,000 |\n"+
		"| pgratelimit | failed | | | | | |\n")
	require.Equal(t, "12,345", thousands(12345))
	require.Equal(t, 1.24, round(1.2361, 2))
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// contender is one way of doing the checks (or the leases) of a workload.
// command returns the process to run (it must not start it) and how to read
// its stdout; tmp is a scratch directory for the run.
type contender struct {
	Name     string
	Workload string // checks or leases
	Server   string // postgres or redis: whose CPU is the server's
	label    func(e *env) string
	command  func(ctx context.Context, e *env, s scenario, tmp string) (*exec.Cmd, func(stdout string) (outcome, error))
}

// contenders lists every contender, in the tables' order.
func contenders() []contender {
	redis := func(what string) func(*env) string {
		return func(e *env) string {
			return strings.TrimSpace(what + " on Redis " + shortVersion(e.version("redis-server", "--version")))
		}
	}
	return []contender{
		{Name: "coalesce", Workload: checks, Server: "postgres", label: fixed("pgratelimit, coalescing (default)"), command: ours("coalesce")},
		{Name: "per-check", Workload: checks, Server: "postgres", label: fixed("pgratelimit, per-check (`DisableCoalescing`)"), command: ours("per-check")},
		{Name: "async", Workload: checks, Server: "postgres", label: fixed("pgratelimit, coalescing, asynchronous commit (`AsyncCommit`)"), command: ours("coalesce", "--commit", "async")},
		{Name: "tx", Workload: checks, Server: "postgres", label: fixed("pgbench: per-check transaction, 5 round trips"), command: pgbench("tx")},
		{Name: "pipelined", Workload: checks, Server: "postgres", label: fixed("pgbench: per-check transaction, pipelined (2 round trips)"), command: pgbench("pipelined")},
		{Name: "upsert", Workload: checks, Server: "postgres", label: fixed("pgbench: one upsert per check"), command: pgbench("upsert")},
		{Name: "rlf", Workload: checks, Server: "postgres", label: func(e *env) string {
			return strings.TrimSpace("rate-limiter-flexible " + e.npmVersion("rate-limiter-flexible") + ", PostgreSQL store")
		}, command: rlf},
		{Name: "redis_rate", Workload: checks, Server: "redis", label: redis("redis_rate v10"), command: redisRate},
		{Name: "leases", Workload: leases, Server: "postgres", label: fixed("pgratelimit `Semaphore`, coalescing (default)"), command: ours("coalesce", "--leases")},
		{Name: "leases-per-check", Workload: leases, Server: "postgres", label: fixed("pgratelimit `Semaphore`, per-check (`DisableCoalescing`)"), command: ours("per-check", "--leases")},
		{Name: "redis_sem", Workload: leases, Server: "redis", label: redis("counting semaphore (sorted set + Lua)"), command: redisSem},
	}
}

// contenderNames are the names of the contenders of workload (all when
// "").
func contenderNames(workload string) []string {
	var n []string
	for _, c := range contendersOfWorkload(workload) {
		n = append(n, c.Name)
	}
	return n
}

// contendersOfWorkload are the contenders of workload (all when "").
func contendersOfWorkload(workload string) []contender {
	if workload == "" {
		return contenders()
	}
	return contendersOf(contenders(), workload)
}

// contendersOf are those of cs of workload.
func contendersOf(cs []contender, workload string) []contender {
	var out []contender
	for _, c := range cs {
		if c.Workload == workload {
			out = append(out, c)
		}
	}
	return out
}

func contenderByName(name string) (contender, bool) {
	for _, c := range contenders() {
		if c.Name == name {
			return c, true
		}
	}
	return contender{}, false
}

func fixed(s string) func(*env) string { return func(*env) string { return s } }

func withEnv(cmd *exec.Cmd, kv ...string) *exec.Cmd {
	cmd.Env = append(os.Environ(), kv...)
	return cmd
}

// ours: pgratelimit's own load benchmark, `pgratelimit bench --json` (package
// bench) in mode, with the flags extra (async: --commit async; leases:
// --leases, with --lease-max of the scenario), run by the binary --ours names
// (this one by default). Its workers call Limiter.AllowN (with --leases,
// Semaphore.Acquire and Release) in the same process; logged tables are the
// durable storage, unlogged the ephemeral one. OURS_FLAGS adds flags (for
// example --coalesce-conns 4).
func ours(mode string, extra ...string) func(context.Context, *env, scenario, string) (*exec.Cmd, func(string) (outcome, error)) {
	return func(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
		storage := "durable"
		if s.Tables == "unlogged" {
			storage = "ephemeral"
		}
		args := []string{"bench", "--database-url", e.pgURL, "--concurrency", strconv.Itoa(s.Conc),
			"--keys", strconv.Itoa(s.Keys), "--duration", strconv.Itoa(s.Secs) + "s",
			"--storage", storage, "--mode", mode, "--json"}
		args = append(args, extra...)
		parse := parseResultLine
		if s.Workload == leases {
			args, parse = append(args, "--lease-max", strconv.Itoa(s.LeaseMax)), parseLeaseLine
		}
		args = append(args, e.oursFlags...)
		return command(ctx, e.ours, args...), parse
	}
}

// pgbench runs one of bench/pgbench/*.sql with one connection per check in
// flight, prepared statements, and a log of every transaction's latency for
// the percentiles.
func pgbench(script string) func(context.Context, *env, scenario, string) (*exec.Cmd, func(string) (outcome, error)) {
	return func(ctx context.Context, e *env, s scenario, tmp string) (*exec.Cmd, func(string) (outcome, error)) {
		failed := func(err error) (*exec.Cmd, func(string) (outcome, error)) {
			return command(ctx, "false"), func(string) (outcome, error) { return outcome{}, err }
		}
		sql, err := os.ReadFile(filepath.Join(e.root, "bench", "pgbench", script+".sql"))
		if err != nil {
			return failed(err)
		}
		file := filepath.Join(tmp, script+".sql")
		sql = []byte(strings.ReplaceAll(string(sql), "TBL", "bench_"+s.Tables))
		if err := os.WriteFile(file, sql, 0o644); err != nil {
			return failed(err)
		}
		logPrefix := filepath.Join(tmp, "pgbench_log")
		cmd := command(ctx, e.tool("pgbench"), "-n", "-M", "prepared",
			"-c", strconv.Itoa(s.Conc), "-j", strconv.Itoa(min(s.Conc, runtime.NumCPU())),
			"-T", strconv.Itoa(s.Secs), "-D", "keys="+strconv.Itoa(s.Keys), "-f", file,
			"-l", "--log-prefix", logPrefix, e.pgURL)
		return cmd, func(stdout string) (outcome, error) { return parsePgbench(stdout, logPrefix) }
	}
}

// parsePgbench reads pgbench's summary (transactions processed and failed,
// tps) and its per-transaction logs under logPrefix, for the percentiles.
func parsePgbench(stdout, logPrefix string) (outcome, error) {
	var o outcome
	var processed, tps string
	for _, l := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(l, "number of transactions actually processed: "); ok {
			processed = leadingNumber(v)
		} else if v, ok := strings.CutPrefix(l, "number of failed transactions: "); ok {
			o.Errors, _ = strconv.ParseInt(leadingNumber(v), 10, 64)
		} else if v, ok := strings.CutPrefix(l, "tps = "); ok {
			tps = leadingNumber(v)
		}
	}
	var err1, err2 error
	o.Checks, err1 = strconv.ParseInt(processed, 10, 64)
	o.ChecksPerSec, err2 = strconv.ParseFloat(tps, 64)
	if err1 != nil || err2 != nil {
		return o, fmt.Errorf("pgbench printed no result: %s", lastLines(stdout, 6))
	}
	if o.ChecksPerSec > 0 {
		o.ElapsedS = float64(o.Checks) / o.ChecksPerSec
	}
	lat, err := pgbenchLatencies(logPrefix)
	if err != nil {
		return o, err
	}
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / 1000 }
	o.P50ms, o.P99ms = pct(0.5), pct(0.99)
	return o, nil
}

// leadingNumber is the number s starts with: "80590" of "80590/80590",
// "1007.5" of "1007.5 (without initial connection time)".
func leadingNumber(s string) string {
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end < 0 {
		return s
	}
	return s[:end]
}

// pgbenchLatencies reads the per-transaction logs, one per thread: lines of
// "client_id transaction_no time script_no time_epoch time_us", time being
// the transaction's latency in microseconds. It returns them sorted.
func pgbenchLatencies(logPrefix string) ([]int64, error) {
	files, _ := filepath.Glob(logPrefix + ".*")
	var lat []int64
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 3 {
				continue
			}
			if us, err := strconv.ParseInt(fs[2], 10, 64); err == nil {
				lat = append(lat, us)
			}
		}
		fh.Close()
	}
	if len(lat) == 0 {
		return nil, fmt.Errorf("pgbench wrote no transaction log under %s", logPrefix)
	}
	slices.Sort(lat)
	return lat, nil
}

// rlf: rate-limiter-flexible's RateLimiterPostgres on node-postgres
// (bench/rlf/bench.js).
func rlf(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
	cmd := command(ctx, "node", filepath.Join(e.root, "bench", "rlf", "bench.js"),
		strconv.Itoa(s.Conc), strconv.Itoa(s.Keys), strconv.Itoa(s.Secs), s.Tables)
	return withEnv(cmd, "DATABASE_URL="+e.pgURL), parseResultLine
}

// redisRate: go-redis/redis_rate on Redis (bench/redisrate). Redis has no
// tables: it runs without persistence in every scenario, logged or not.
func redisRate(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
	cmd := command(ctx, filepath.Join(e.bindir, "redisrate"), strconv.Itoa(s.Conc), strconv.Itoa(s.Keys), strconv.Itoa(s.Secs))
	return withEnv(cmd, "REDIS_ADDR="+e.redisAddr), parseResultLine
}

// redisSem: the usual Redis counting semaphore (bench/redissem): a sorted
// set per key, a Lua script to acquire, ZREM to release. Without
// persistence, as redis_rate.
func redisSem(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
	cmd := command(ctx, filepath.Join(e.bindir, "redissem"), strconv.Itoa(s.Conc), strconv.Itoa(s.Keys), strconv.Itoa(s.Secs), strconv.Itoa(s.LeaseMax))
	return withEnv(cmd, "REDIS_ADDR="+e.redisAddr), parseLeaseLine
}

// resultLine is a contender's JSON line: pgratelimit bench's Report, whose
// checks are the allowed and the denied, or the line of redisrate and
// rlf/bench.js, which count them (checks) and their time (elapsed_s).
type resultLine struct {
	oursReport
	Checks   *int64  `json:"checks"`
	ElapsedS float64 `json:"elapsed_s"`
}

// parseResultLine reads the last line of stdout that is a JSON object.
func parseResultLine(stdout string) (outcome, error) {
	var line string
	for _, l := range strings.Split(stdout, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "{") {
			line = l
		}
	}
	if line == "" {
		return outcome{}, errors.New("no JSON result line on stdout")
	}
	var r resultLine
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return outcome{}, fmt.Errorf("result line %q: %w", line, err)
	}
	o := outcome{Errors: r.Errors, ElapsedS: r.ElapsedS, ChecksPerSec: r.ChecksPerSec, P50ms: r.P50ms, P99ms: r.P99ms}
	if r.Checks != nil {
		o.Checks = *r.Checks
	} else { // pgratelimit bench: every check is allowed or denied
		o.Checks = r.Allowed + r.Denied
	}
	if o.ElapsedS == 0 && o.ChecksPerSec > 0 {
		o.ElapsedS = float64(o.Checks) / o.ChecksPerSec
	}
	if r.Audit != "" { // pgratelimit bench's figures beyond the others'
		o.Extra = map[string]any{"audit": r.Audit, "hot_update_ratio": r.HotRatio, "updates": r.Updates,
			"max_ms": r.MaxMs, "allowed": r.Allowed, "denied": r.Denied}
	}
	return o, nil
}

// parseLeaseLine reads the last JSON line of stdout of a contender of
// leases, pgratelimit bench --leases's Report or redissem's line, whose
// unit is the acquire+release pair: pairs, pairs_per_sec, the pairs' p50_ms
// and p99_ms, denied (acquisitions that found no free units), errors,
// audit, and elapsed_s (redissem's).
func parseLeaseLine(stdout string) (outcome, error) {
	var line string
	for _, l := range strings.Split(stdout, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "{") {
			line = l
		}
	}
	if line == "" {
		return outcome{}, errors.New("no JSON result line on stdout")
	}
	var r resultLine
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return outcome{}, fmt.Errorf("result line %q: %w", line, err)
	}
	if r.Pairs == 0 && r.PairsPerSec == 0 && r.Denied == 0 {
		return outcome{}, fmt.Errorf("result line %q: no pairs (is it a contender of leases?)", line)
	}
	o := outcome{Checks: r.Pairs, Denied: r.Denied, Errors: r.Errors, ElapsedS: r.ElapsedS, ChecksPerSec: r.PairsPerSec, P50ms: r.P50ms, P99ms: r.P99ms}
	if o.ElapsedS == 0 && o.ChecksPerSec > 0 {
		o.ElapsedS = float64(o.Checks) / o.ChecksPerSec
	}
	o.Extra = map[string]any{"audit": r.Audit, "max_ms": r.MaxMs, "denied": r.Denied}
	return o, nil
}

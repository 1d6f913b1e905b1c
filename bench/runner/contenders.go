package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// contender is one way of doing the checks. command returns the process to run (it
// must not start it) and how to read its stdout; tmp is a scratch directory for the run.
type contender struct {
	Name    string
	Server  string // postgres or redis: whose CPU is the server's
	label   func(e *env) string
	command func(ctx context.Context, e *env, s scenario, tmp string) (*exec.Cmd, func(stdout string) (outcome, error))
}

var allContenders = []contender{
	{Name: "coalesce", Server: "postgres", label: fixed("pgratelimit, coalescing (default)"), command: ours("coalesce")},
	{Name: "per-check", Server: "postgres", label: fixed("pgratelimit, per-check (`DisableCoalescing`)"), command: ours("per-check")},
	{Name: "tx", Server: "postgres", label: fixed("pgbench: per-check transaction, 5 round trips"), command: pgbench("tx")},
	{Name: "pipelined", Server: "postgres", label: fixed("pgbench: per-check transaction, pipelined (2 round trips)"), command: pgbench("pipelined")},
	{Name: "upsert", Server: "postgres", label: fixed("pgbench: one upsert per check"), command: pgbench("upsert")},
	{Name: "rlf", Server: "postgres", label: func(e *env) string {
		return strings.TrimSpace("rate-limiter-flexible " + e.npmVersion("rate-limiter-flexible") + ", PostgreSQL store")
	}, command: rlf},
	{Name: "redis_rate", Server: "redis", label: func(e *env) string {
		return strings.TrimSpace("redis_rate v10 on Redis " + shortVersion(e.version("redis-server", "--version")))
	}, command: redisRate},
}

func contenderNames() []string {
	var n []string
	for _, c := range allContenders {
		n = append(n, c.Name)
	}
	return n
}

func contenderByName(name string) (contender, bool) {
	for _, c := range allContenders {
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

// ours: this repository's CLI, `pgratelimit bench --json`, built by peers.sh from
// ./cmd/pgratelimit. Its workers call Limiter.AllowN in the same process; logged tables
// are the durable storage, unlogged the ephemeral one. OURS_FLAGS adds flags (for
// example --coalesce-conns 4).
func ours(mode string) func(context.Context, *env, scenario, string) (*exec.Cmd, func(string) (outcome, error)) {
	return func(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
		storage := "durable"
		if s.Tables == "unlogged" {
			storage = "ephemeral"
		}
		args := []string{"bench", "--database-url", e.pgURL, "--concurrency", strconv.Itoa(s.Conc),
			"--keys", strconv.Itoa(s.Keys), "--duration", strconv.Itoa(s.Secs) + "s",
			"--storage", storage, "--mode", mode, "--json"}
		args = append(args, strings.Fields(os.Getenv("OURS_FLAGS"))...)
		return command(ctx, filepath.Join(e.bindir, "pgratelimit"), args...), parseJSONLine
	}
}

// pgbench runs one of bench/pgbench/*.sql with one connection per check in flight,
// prepared statements, and a log of every transaction's latency for the percentiles.
func pgbench(script string) func(context.Context, *env, scenario, string) (*exec.Cmd, func(string) (outcome, error)) {
	return func(ctx context.Context, e *env, s scenario, tmp string) (*exec.Cmd, func(string) (outcome, error)) {
		sql, err := os.ReadFile(filepath.Join(e.root, "bench", "pgbench", script+".sql"))
		if err != nil {
			return command(ctx, "false"), func(string) (outcome, error) { return outcome{}, err }
		}
		file := filepath.Join(tmp, script+".sql")
		sql = []byte(strings.ReplaceAll(string(sql), "TBL", "bench_"+s.Tables))
		if err := os.WriteFile(file, sql, 0o644); err != nil {
			return command(ctx, "false"), func(string) (outcome, error) { return outcome{}, err }
		}
		logPrefix := filepath.Join(tmp, "pgbench_log")
		cmd := command(ctx, e.tool("pgbench"), "-n", "-M", "prepared",
			"-c", strconv.Itoa(s.Conc), "-j", strconv.Itoa(min(s.Conc, runtime.NumCPU())),
			"-T", strconv.Itoa(s.Secs), "-D", "keys="+strconv.Itoa(s.Keys), "-f", file,
			"-l", "--log-prefix", logPrefix, e.pgURL)
		return cmd, func(stdout string) (outcome, error) { return parsePgbench(stdout, logPrefix) }
	}
}

var (
	reProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
	reFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	reTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
)

func parsePgbench(stdout, logPrefix string) (outcome, error) {
	var o outcome
	m := reProcessed.FindStringSubmatch(stdout)
	t := reTPS.FindStringSubmatch(stdout)
	if m == nil || t == nil {
		return o, fmt.Errorf("pgbench printed no result: %s", lastLines(stdout, 6))
	}
	o.Checks, _ = strconv.ParseInt(m[1], 10, 64)
	o.ChecksPerSec, _ = strconv.ParseFloat(t[1], 64)
	if f := reFailed.FindStringSubmatch(stdout); f != nil {
		o.Errors, _ = strconv.ParseInt(f[1], 10, 64)
	}
	if o.ChecksPerSec > 0 {
		o.ElapsedS = float64(o.Checks) / o.ChecksPerSec
	}
	// The per-transaction logs, one per thread: "client_id transaction_no time script_no
	// time_epoch time_us", time being the transaction's latency in microseconds.
	files, _ := filepath.Glob(logPrefix + ".*")
	var lat []int64
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return o, err
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
		return o, fmt.Errorf("pgbench wrote no transaction log under %s", logPrefix)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / 1000 }
	o.P50ms, o.P99ms = pct(0.5), pct(0.99)
	return o, nil
}

// rlf: rate-limiter-flexible's RateLimiterPostgres on node-postgres (bench/rlf/bench.js).
func rlf(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
	cmd := command(ctx, "node", filepath.Join(e.root, "bench", "rlf", "bench.js"),
		strconv.Itoa(s.Conc), strconv.Itoa(s.Keys), strconv.Itoa(s.Secs), s.Tables)
	return withEnv(cmd, "DATABASE_URL="+e.pgURL), parseJSONLine
}

// redisRate: go-redis/redis_rate on Redis (bench/redisrate). Redis has no tables: it
// runs without persistence in every scenario, logged or not.
func redisRate(ctx context.Context, e *env, s scenario, _ string) (*exec.Cmd, func(string) (outcome, error)) {
	cmd := command(ctx, filepath.Join(e.bindir, "redisrate"), strconv.Itoa(s.Conc), strconv.Itoa(s.Keys), strconv.Itoa(s.Secs))
	return withEnv(cmd, "REDIS_ADDR="+e.redisAddr), parseJSONLine
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clkTck is USER_HZ, the unit of the CPU times in /proc: 100 on Linux.
const clkTck = 100

// result is one run of one contender.
type result struct {
	Run          int     `json:"run,omitempty"`
	Checks       int64   `json:"checks"`
	Errors       int64   `json:"errors"`
	ElapsedS     float64 `json:"elapsed_s"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// CPU time over the whole run of the contender's process (start-up and shutdown
	// included), in seconds, and per check, in microseconds.
	ServerCPUs       float64 `json:"server_cpu_s"`
	ClientCPUs       float64 `json:"client_cpu_s"`
	ServerUsPerCheck float64 `json:"server_us_per_check"`
	ClientUsPerCheck float64 `json:"client_us_per_check"`
	// OtherLoad is the share of the machine's CPU (all cores) used during the run by
	// anything but the server and the client: other work on a shared machine, and the
	// delay proxies when LATENCY_MS is set.
	OtherLoad float64        `json:"other_load"`
	WallS     float64        `json:"wall_s"`
	Extra     map[string]any `json:"extra,omitempty"`
	Error     string         `json:"error,omitempty"`
}

// outcome is what a contender reports of itself.
type outcome struct {
	Checks       int64
	Errors       int64
	ElapsedS     float64
	ChecksPerSec float64
	P50ms, P99ms float64
	Extra        map[string]any
}

// statTicks returns utime+stime+cutime+cstime of a process (all its threads, and its
// children that it has waited for), and its parent's pid.
func statTicks(pid int) (ticks int64, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces: count fields
	// from the last ')'. Then state is field 3, ppid 4, utime 14 ... cstime 17.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	for _, s := range f[11:15] {
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	return ticks, ppid, true
}

// children lists the pids whose parent is pid.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, d := range ents {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := statTicks(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// serverTicks is the CPU the server has used so far. PostgreSQL: the postmaster and
// every process it started, the backends of exited connections included (the kernel adds
// a reaped child's time to its parent's cutime and cstime). Redis: redis-server, all of
// its threads.
func (e *env) serverTicks(server string) int64 {
	switch server {
	case "postgres":
		t, _, _ := statTicks(e.pgPID)
		for _, c := range children(e.pgPID) {
			ct, _, _ := statTicks(c)
			t += ct
		}
		return t
	case "redis":
		t, _, _ := statTicks(e.redis.Process.Pid)
		return t
	}
	return 0
}

// machineTicks returns the busy and total CPU ticks of the whole machine (all cores).
func machineTicks() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i, s := range f[1:min(len(f), 9)] {
		n, _ := strconv.ParseInt(s, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// prepare gives every contender the same start: empty tables (or an empty Redis) and
// no checkpoint pending, done before its measurement starts.
func (e *env) prepare(ctx context.Context, c contender) error {
	switch c.Server {
	case "postgres":
		_, err := output(command(ctx, e.tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", e.adminURL,
			"-c", "TRUNCATE bench_logged, bench_unlogged, rlf_logged, rlf_unlogged",
			"-c", "VACUUM ANALYZE", "-c", "CHECKPOINT"))
		return err
	case "redis":
		out, err := redisCmd(e.redisAdmin, "FLUSHALL")
		if err == nil && out != "+OK" {
			err = fmt.Errorf("FLUSHALL: %s", out)
		}
		return err
	}
	return nil
}

// settle waits, up to 3 s, until the backends of the contender's connections have
// exited and been reaped, so that their CPU is in the postmaster's cutime and cstime.
func (e *env) settle(server string, baseline int) {
	if server != "postgres" {
		return
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if len(children(e.pgPID)) <= baseline {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// measure runs one contender once: its process starts after the server's CPU counters
// are read, and they are read again once it has exited and its connections are gone.
func (e *env) measure(ctx context.Context, c contender, s scenario) (res result) {
	if err := e.prepare(ctx, c); err != nil {
		res.Error = "preparing: " + err.Error()
		return res
	}
	rctx, cancel := context.WithTimeout(ctx, time.Duration(s.Secs)*time.Second+3*time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "pgratelimit-bench-run-")
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer os.RemoveAll(tmp)
	cmd, parse := c.command(rctx, e, s, tmp)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	baseline := 0
	if c.Server == "postgres" {
		baseline = len(children(e.pgPID))
	}
	busy0, total0 := machineTicks()
	server0 := e.serverTicks(c.Server)
	t0 := time.Now()
	runErr := cmd.Run()
	res.WallS = round(time.Since(t0).Seconds(), 2)
	e.settle(c.Server, baseline)
	server1 := e.serverTicks(c.Server)
	busy1, total1 := machineTicks()

	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			res.ClientCPUs = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		}
	}
	res.ServerCPUs = float64(server1-server0) / clkTck
	if total1 > total0 {
		other := float64(busy1-busy0)/clkTck - res.ServerCPUs - res.ClientCPUs
		res.OtherLoad = round(max(0, other/(float64(total1-total0)/clkTck)), 3)
	}
	res.ServerCPUs, res.ClientCPUs = round(res.ServerCPUs, 2), round(res.ClientCPUs, 2)

	if ctx.Err() != nil {
		res.Error = "interrupted"
		return res
	}
	out, perr := parse(stdout.String())
	if perr != nil || runErr != nil {
		msg := []string{}
		if runErr != nil {
			msg = append(msg, runErr.Error())
		}
		if perr != nil {
			msg = append(msg, perr.Error())
		}
		if t := strings.TrimSpace(lastLines(stripProgress(stderr.String()), 6)); t != "" {
			msg = append(msg, t)
		}
		res.Error = strings.Join(msg, ": ")
		if perr != nil {
			return res
		}
	}
	res.Checks, res.Errors, res.Extra = out.Checks, out.Errors, out.Extra
	res.ElapsedS = round(out.ElapsedS, 2)
	res.ChecksPerSec = round(out.ChecksPerSec, 0)
	res.P50ms, res.P99ms = round(out.P50ms, 3), round(out.P99ms, 3)
	if res.Checks > 0 {
		res.ServerUsPerCheck = round(float64(server1-server0)/clkTck/float64(res.Checks)*1e6, 1)
		res.ClientUsPerCheck = round(res.ClientCPUs/float64(res.Checks)*1e6, 1)
	}
	return res
}

// stripProgress drops the \r-separated progress updates a contender draws on stderr.
func stripProgress(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if i := strings.LastIndexByte(l, '\r'); i >= 0 {
			l = l[i+1:]
		}
		l = strings.TrimPrefix(l, "\033[K")
		if l != "" {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func round(x float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	if x < 0 {
		return -float64(int64(-x*p+0.5)) / p
	}
	return float64(int64(x*p+0.5)) / p
}

// parseJSONLine reads the last line of stdout that is a JSON object: the report of
// the contenders that print one (pgratelimit's bench --json, redisrate, rlf/bench.js).
func parseJSONLine(stdout string) (outcome, error) {
	var line string
	for _, l := range strings.Split(stdout, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "{") {
			line = l
		}
	}
	if line == "" {
		return outcome{}, errNoResult
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		return outcome{}, fmt.Errorf("result line %q: %w", line, err)
	}
	num := func(k string) float64 { f, _ := m[k].(float64); return f }
	o := outcome{
		Checks: int64(num("checks")), Errors: int64(num("errors")), ElapsedS: num("elapsed_s"),
		ChecksPerSec: num("checks_per_sec"), P50ms: num("p50_ms"), P99ms: num("p99_ms"),
	}
	if _, ok := m["checks"]; !ok { // pgratelimit bench: every check is allowed or denied
		o.Checks = int64(num("allowed") + num("denied"))
	}
	if o.ElapsedS == 0 && o.ChecksPerSec > 0 {
		o.ElapsedS = float64(o.Checks) / o.ChecksPerSec
	}
	for _, k := range []string{"audit", "hot_update_ratio", "updates", "max_ms", "allowed", "denied"} {
		if v, ok := m[k]; ok {
			if o.Extra == nil {
				o.Extra = map[string]any{}
			}
			o.Extra[k] = v
		}
	}
	return o, nil
}

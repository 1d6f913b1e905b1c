package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
)

// result is one run of one contender. In the workload of leases, its checks
// are acquire+release pairs (Denied: the acquisitions that found no free
// units), and its figures per check are per pair.
type result struct {
	Run          int     `json:"run,omitempty"`
	Checks       int64   `json:"checks"`
	Denied       int64   `json:"denied,omitempty"` // acquisitions that found no free units (leases)
	Errors       int64   `json:"errors"`
	ElapsedS     float64 `json:"elapsed_s"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// CPU time over the whole run of the contender's process (start-up and
	// shutdown included), in seconds, and per check, in microseconds.
	ServerCPUs       float64 `json:"server_cpu_s"`
	ClientCPUs       float64 `json:"client_cpu_s"`
	ServerUsPerCheck float64 `json:"server_us_per_check"`
	ClientUsPerCheck float64 `json:"client_us_per_check"`
	// OtherLoad is the share of the machine's CPU (all cores) used during
	// the run by anything but the server and the client: other work on a
	// shared machine, and the delay proxies when LATENCY_MS is set.
	OtherLoad float64        `json:"other_load"`
	WallS     float64        `json:"wall_s"`
	Extra     map[string]any `json:"extra,omitempty"`
	Error     string         `json:"error,omitempty"`
}

// outcome is what a contender reports of itself. In the workload of
// leases, a check is an acquire+release pair.
type outcome struct {
	Checks       int64
	Denied       int64
	Errors       int64
	ElapsedS     float64
	ChecksPerSec float64
	P50ms, P99ms float64
	Extra        map[string]any
}

// serverCPU is the CPU the server has used so far. PostgreSQL: the
// postmaster and every process it started, the backends of closed
// connections included. Redis: redis-server, all of its threads.
func (e *env) serverCPU(server string) time.Duration {
	switch server {
	case "postgres":
		return cpuTree(e.pgPID)
	case "redis":
		st, _ := cpuProcess(e.redis.Process.Pid)
		return st.Total()
	}
	return 0
}

// prepare gives every contender the same start: empty tables (or an empty
// Redis) and no checkpoint pending, done before its measurement starts.
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

// settle waits, up to 3 s, until the backends of the contender's
// connections have exited and been reaped, so that their CPU is in the
// postmaster's.
func (e *env) settle(server string, baseline int) {
	if server != "postgres" {
		return
	}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if len(childrenOf(e.pgPID)) <= baseline {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// measure runs one contender once: its process starts after the server's
// CPU time is read, which is read again once it has exited and its
// connections are gone.
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
		baseline = len(childrenOf(e.pgPID))
	}
	busy0, total0 := machineCPU()
	server0 := e.serverCPU(c.Server)
	t0 := time.Now()
	runErr := cmd.Run()
	res.WallS = round(time.Since(t0).Seconds(), 2)
	e.settle(c.Server, baseline)
	server := e.serverCPU(c.Server) - server0
	busy1, total1 := machineCPU()
	client := cpuExited(cmd.ProcessState)
	res.ServerCPUs, res.ClientCPUs = round(server.Seconds(), 2), round(client.Seconds(), 2)
	if total1 > total0 {
		other := busy1 - busy0 - server - client
		res.OtherLoad = round(max(0, other.Seconds()/(total1-total0).Seconds()), 3)
	}
	if ctx.Err() != nil {
		res.Error = "interrupted"
		return res
	}
	out, perr := parse(stdout.String())
	if perr != nil || runErr != nil {
		res.Error = failure(runErr, perr, stderr.String())
		if perr != nil {
			return res
		}
	}
	res.Checks, res.Denied, res.Errors, res.Extra = out.Checks, out.Denied, out.Errors, out.Extra
	res.ElapsedS = round(out.ElapsedS, 2)
	res.ChecksPerSec = round(out.ChecksPerSec, 0)
	res.P50ms, res.P99ms = round(out.P50ms, 3), round(out.P99ms, 3)
	if res.Checks > 0 {
		res.ServerUsPerCheck = round(server.Seconds()/float64(res.Checks)*1e6, 1)
		res.ClientUsPerCheck = round(client.Seconds()/float64(res.Checks)*1e6, 1)
	}
	return res
}

// failure says why a run failed: its exit, what its output lacked, and the
// last lines of its stderr.
func failure(runErr, parseErr error, stderr string) string {
	var msg []string
	if runErr != nil {
		msg = append(msg, runErr.Error())
	}
	if parseErr != nil {
		msg = append(msg, parseErr.Error())
	}
	if t := strings.TrimSpace(lastLines(stripProgress(stderr), 6)); t != "" {
		msg = append(msg, t)
	}
	return strings.Join(msg, ": ")
}

// stripProgress drops the \r-separated progress updates a contender draws
// on stderr.
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

// round rounds x to digits decimal places.
func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

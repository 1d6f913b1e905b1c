package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// env is one benchmark session: the throwaway servers and the addresses the contenders
// use (through the delay proxies when LATENCY_MS is set).
type env struct {
	root, bindir, pgbin string
	latency             time.Duration
	ours                string   // the pgratelimit binary of ours
	oursBin             string   // --ours, if given: pgratelimit not built from this tree
	oursFlags           []string // OURS_FLAGS
	stderr              io.Writer

	dir      string // the servers' temporary directory
	asPG     bool   // running as root: PostgreSQL's tools run as the postgres user
	pgPort   int
	pgPID    int // the postmaster
	pgURL    string
	adminURL string // direct, never through a proxy

	redis      *exec.Cmd
	redisAddr  string
	redisAdmin string

	proxies []*delayProxy
}

func (e *env) tool(name string) string {
	if e.pgbin != "" {
		if p := filepath.Join(e.pgbin, name); isExecutable(p) {
			return p
		}
	}
	return name
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// command makes a command in a process group of its own, so that a terminal's Ctrl-C
// reaches only the runner, which ends it (the whole group) itself.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// pgCommand runs a PostgreSQL server tool, as the postgres user when the runner is root
// (initdb and postgres refuse to run as root).
func (e *env) pgCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	if e.asPG {
		return command(ctx, "runuser", append([]string{"-u", "postgres", "--", e.tool(name)}, args...)...)
	}
	return command(ctx, e.tool(name), args...)
}

func output(cmd *exec.Cmd) (string, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", filepath.Base(cmd.Path), err, lastLines(out.String(), 8))
	}
	return out.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start brings up what the contenders need: PostgreSQL unless only redis_rate runs,
// Redis if redis_rate does.
func (e *env) start(ctx context.Context, scenarios []scenario, cs []contender) error {
	needPG, needRedis := false, false
	for _, c := range cs {
		needPG = needPG || c.Server == "postgres"
		needRedis = needRedis || c.Server == "redis"
	}
	maxConc := 0
	for _, s := range scenarios {
		maxConc = max(maxConc, s.Conc)
	}
	var err error
	if e.dir, err = os.MkdirTemp("", "pgratelimit-bench-"); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "peers: throwaway servers in %s\n", e.dir)
	if needPG {
		if err := e.startPostgres(ctx, maxConc); err != nil {
			return fmt.Errorf("starting PostgreSQL: %w", err)
		}
	}
	if needRedis {
		if err := e.startRedis(ctx); err != nil {
			return fmt.Errorf("starting Redis: %w", err)
		}
	}
	if e.latency > 0 {
		if needPG {
			p, err := startDelayProxy(fmt.Sprintf("127.0.0.1:%d", e.pgPort), e.latency)
			if err != nil {
				return err
			}
			e.proxies = append(e.proxies, p)
			e.pgURL = pgURL(p.addr)
		}
		if needRedis {
			p, err := startDelayProxy(e.redisAdmin, e.latency)
			if err != nil {
				return err
			}
			e.proxies = append(e.proxies, p)
			e.redisAddr = p.addr
		}
		fmt.Fprintf(e.stderr, "peers: every response from PostgreSQL and Redis delayed %s by a proxy in the runner\n", e.latency)
	}
	return nil
}

func pgURL(hostport string) string {
	return "postgres://postgres@" + hostport + "/postgres?sslmode=disable"
}

func (e *env) startPostgres(ctx context.Context, maxConc int) error {
	e.asPG = os.Geteuid() == 0
	if e.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root, PostgreSQL needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(e.dir, uid, gid); err != nil {
			return err
		}
	}
	data := filepath.Join(e.dir, "pg")
	if _, err := output(e.pgCommand(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")); err != nil {
		return err
	}
	var err error
	if e.pgPort, err = freePort(); err != nil {
		return err
	}
	// Defaults but for these: loopback and a socket in the temporary directory only,
	// room for every contender's connections, and shared buffers that hold the tables.
	// fsync and synchronous_commit stay on: logged tables are durable.
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=%d -c shared_buffers=512MB",
		e.pgPort, e.dir, max(100, maxConc+30))
	if _, err := output(e.pgCommand(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(e.dir, "pg.log"),
		"-w", "-t", "60", "-o", opts, "start")); err != nil {
		if b, rerr := os.ReadFile(filepath.Join(e.dir, "pg.log")); rerr == nil {
			err = fmt.Errorf("%w\n%s", err, lastLines(string(b), 10))
		}
		return err
	}
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return err
	}
	if e.pgPID, err = strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err != nil {
		return fmt.Errorf("postmaster.pid: %w", err)
	}
	e.adminURL = pgURL(fmt.Sprintf("127.0.0.1:%d", e.pgPort))
	e.pgURL = e.adminURL
	_, err = output(command(ctx, e.tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", e.adminURL,
		"-f", filepath.Join(e.root, "bench", "pgbench", "schema.sql")))
	return err
}

func (e *env) startRedis(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	e.redisAdmin = fmt.Sprintf("127.0.0.1:%d", port)
	e.redisAddr = e.redisAdmin
	// Loopback only, no persistence (no RDB snapshots, no AOF): Redis as a rate limiter's
	// store usually runs, and the way that costs it least.
	e.redis = command(context.WithoutCancel(ctx), "redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", e.dir, "--logfile", filepath.Join(e.dir, "redis.log"),
		"--daemonize", "no", "--protected-mode", "yes")
	if err := e.redis.Start(); err != nil {
		e.redis = nil
		return err
	}
	for range 100 {
		if out, err := redisCmd(e.redisAdmin, "PING"); err == nil && out == "+PONG" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(e.dir, "redis.log"))
	return fmt.Errorf("redis-server did not answer PING in 10 s: %s", lastLines(string(b), 10))
}

// redisCmd sends one inline command and returns the first line of the reply.
func redisCmd(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// stop stops the servers and removes their files. It is safe to call after a failed
// or partial start, and it runs whatever the run's context says.
func (e *env) stop() {
	for _, p := range e.proxies {
		p.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if e.pgPID != 0 {
		if _, err := output(e.pgCommand(ctx, "pg_ctl", "-D", filepath.Join(e.dir, "pg"), "-m", "fast", "-w", "stop")); err != nil {
			fmt.Fprintln(e.stderr, "peers: stopping PostgreSQL:", err)
			_ = syscall.Kill(e.pgPID, syscall.SIGQUIT) // immediate shutdown
			time.Sleep(time.Second)
		}
	}
	if e.redis != nil && e.redis.Process != nil {
		_ = e.redis.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = e.redis.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = e.redis.Process.Kill()
			<-done
		}
	}
	if e.dir != "" {
		if err := os.RemoveAll(e.dir); err != nil {
			fmt.Fprintln(e.stderr, "peers: removing the servers' files:", err)
		}
	}
}

// machine describes where and with what the figures were taken.
func (e *env) machine() map[string]any {
	m := map[string]any{
		"cpus": runtime.NumCPU(),
		"go":   runtime.Version(),
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_at_start"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) >= 2 {
			if kb, err := strconv.Atoi(f[1]); err == nil {
				m["memory_gib"] = round(float64(kb)/(1<<20), 1)
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m["os"] = strings.Trim(v, `"`)
			}
		}
	}
	m["postgresql"] = e.version(e.tool("postgres"), "--version")
	m["redis"] = e.version("redis-server", "--version")
	m["node"] = e.version("node", "--version")
	m["rate_limiter_flexible"] = e.npmVersion("rate-limiter-flexible")
	m["pg_npm"] = e.npmVersion("pg")
	if out, err := exec.Command("git", "-C", e.root, "describe", "--always", "--dirty").Output(); err == nil {
		m["commit"] = strings.TrimSpace(string(out))
	}
	if e.oursBin != "" {
		m["ours_bin"] = e.oursBin // pgratelimit was not built from this tree
	}
	if len(e.oursFlags) > 0 {
		m["ours_flags"] = strings.Join(e.oursFlags, " ")
	}
	return m
}

func (e *env) version(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func (e *env) npmVersion(pkg string) string {
	b, err := os.ReadFile(filepath.Join(e.root, "bench", "rlf", "node_modules", pkg, "package.json"))
	if err != nil {
		return ""
	}
	const k = `"version": "`
	i := bytes.Index(b, []byte(k))
	if i < 0 {
		return ""
	}
	v := b[i+len(k):]
	if j := bytes.IndexByte(v, '"'); j >= 0 {
		return string(v[:j])
	}
	return ""
}

// shortVersion picks "15.18" out of "postgres (PostgreSQL) 15.18 (Debian ...)" and
// "7.0.15" out of "Redis server v=7.0.15 sha=...".
func shortVersion(s string) string {
	for _, f := range strings.Fields(s) {
		f = strings.TrimPrefix(f, "v=")
		f = strings.TrimPrefix(f, "v")
		if len(f) > 0 && f[0] >= '0' && f[0] <= '9' && strings.Contains(f, ".") {
			return f
		}
	}
	return ""
}

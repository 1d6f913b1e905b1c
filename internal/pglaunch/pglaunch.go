// Package pglaunch gets a PostgreSQL to talk to on any machine: a URL from
// the environment, a container when the caller supplies a way to start one
// (the integration tests use testcontainers-go; this package depends on
// nothing but the standard library, so the library module stays lean), or a
// throwaway cluster made with the installed server binaries. The test suites
// and the CLI's demo use it.
//
// A throwaway cluster's postmaster is a child of the process that started
// it, and dies with it: on Linux even when that process is killed outright
// (SIGKILL, a test binary's -timeout panic), through the parent-death
// signal (see StartTied). Only its temporary directory is then left behind.
package pglaunch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrUnavailable is returned by Start when no way of getting a PostgreSQL
// worked. Its message lists why each one failed.
var ErrUnavailable = errors.New("pglaunch: no PostgreSQL available")

// ErrNoServerBinaries is why no local cluster started when there are no
// server binaries to start one with (see BinDirEnv).
var ErrNoServerBinaries = errors.New("no PostgreSQL server binaries")

// Options tune Start.
type Options struct {
	// EnvVar names an environment variable holding a database URL to use as
	// is, if set (e.g. PGRATELIMIT_TEST_DATABASE_URL). Empty: none.
	EnvVar string
	// Container, when set, is tried after EnvVar: it starts a database in a
	// container and returns its URL and how to stop it, or an error (no
	// Docker engine, say) to fall through to the local server binaries.
	Container func(ctx context.Context) (url string, stop func(context.Context) error, err error)
	// TCP makes a local cluster also listen on a loopback TCP port (Port),
	// and the URL use it; by default it listens on a unix socket only.
	TCP bool
	// Port is the loopback port of TCP. Defaults to a free one.
	Port int
	// Logf, when set, is told which way was taken and why others were not.
	Logf func(format string, args ...any)
}

// Instance is a running PostgreSQL.
type Instance struct {
	// URL connects as a superuser to the instance's postgres database.
	URL string
	// Source says where it came from: "env", "docker" or "local".
	Source string
	// DataDir is a local cluster's data directory ("" otherwise).
	DataDir string

	stop func(context.Context) error

	// A local cluster's server binaries, how to run them and the postmaster's
	// arguments; proc is the postmaster running now.
	bin  string
	as   runAs
	args []string
	mu   sync.Mutex
	proc *Process
}

// Close stops and removes a database this package started; for a URL from the
// environment it does nothing.
func (in *Instance) Close(ctx context.Context) error {
	if in.stop == nil {
		return nil
	}
	return in.stop(ctx)
}

// Start returns a running PostgreSQL, trying in order: the URL in
// opts.EnvVar; opts.Container (unless BinDirEnv is set); the installed server
// binaries (see BinDirEnv). It returns ErrUnavailable, with each reason, when
// none works.
func Start(ctx context.Context, opts Options) (*Instance, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if opts.EnvVar != "" {
		if u := os.Getenv(opts.EnvVar); u != "" {
			logf("pglaunch: using %s", opts.EnvVar)
			return &Instance{URL: u, Source: "env"}, nil
		}
	}
	var reasons []string
	if dir := os.Getenv(BinDirEnv); dir != "" && opts.Container != nil {
		// The caller chose the server binaries (another PostgreSQL version,
		// say): a container would run some other version instead.
		logf("pglaunch: %s=%s set; not trying a container", BinDirEnv, dir)
	} else if opts.Container != nil {
		u, stop, err := opts.Container(ctx)
		if err == nil {
			logf("pglaunch: started a container")
			return &Instance{URL: u, Source: "docker", stop: stop}, nil
		}
		reasons = append(reasons, "docker: "+err.Error())
		logf("pglaunch: no container (%v); trying local server binaries", err)
	}

	in, err := startLocal(ctx, opts)
	if err == nil {
		logf("pglaunch: started a local cluster in %s", in.DataDir)
		return in, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	if opts.EnvVar != "" {
		reasons = append([]string{opts.EnvVar + " is not set"}, reasons...)
	}
	return nil, fmt.Errorf("%w: %s", ErrUnavailable, strings.Join(reasons, "; "))
}

// BinDirEnv names the environment variable that chooses the folder of the
// server binaries (initdb, postgres) for local clusters, e.g. another
// PostgreSQL version's; when set, Start tries no container. Unset: those of
// the initdb on PATH, else the newest /usr/lib/postgresql/*/bin.
const BinDirEnv = "PGRATELIMIT_PG_BIN"

// binDir finds the directory of initdb and postgres.
func binDir() (string, error) {
	has := func(dir string) error {
		for _, b := range []string{"initdb", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return err
			}
		}
		return nil
	}
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if err := has(dir); err != nil {
			return "", fmt.Errorf("%w in %s=%s: %w", ErrNoServerBinaries, BinDirEnv, dir, err)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); has(dir) == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if has(d) == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("%w: initdb and postgres are not on PATH nor in /usr/lib/postgresql/*/bin", ErrNoServerBinaries)
	}
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return found[0], nil
}

// runAs runs a server binary, as the postgres OS user when we are root
// (initdb and postgres refuse to run as root).
type runAs struct {
	cred *syscall.Credential
}

func newRunAs(dir string) (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root and there is no postgres OS user to run the server as: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return runAs{}, err
	}
	return runAs{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

func (r runAs) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	cmd.Dir = os.TempDir()
	return cmd
}

// run runs a command to its end (initdb), killed if we die meanwhile.
func (r runAs) run(ctx context.Context, name string, args ...string) error {
	cmd := r.command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second // a child that keeps the output open must not hang us
	p, err := StartTied(cmd, syscall.SIGKILL)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartLocal starts a throwaway cluster with the installed server binaries
// only (no environment, no Docker): for tests that stop, restart or crash
// their server.
func StartLocal(ctx context.Context, opts Options) (*Instance, error) {
	return startLocal(ctx, opts)
}

// startTimeout bounds a local cluster's start when ctx has no deadline.
const startTimeout = 5 * time.Minute

// startLocal makes a throwaway cluster in a temporary directory, with fsync
// off, listening on a unix socket in that directory. Its postmaster is a
// child of this process, started with StartTied: it shuts down (SIGQUIT,
// PostgreSQL's immediate shutdown, which ends its backends too) when this
// process ends, however it ends.
func startLocal(ctx context.Context, opts Options) (*Instance, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := TempDir("pgratelimit-pg-")
	if err != nil {
		return nil, err
	}
	as, err := newRunAs(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := as.run(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	listen, port := "", 5432
	if opts.TCP {
		if port = opts.Port; port == 0 {
			if port, err = freePort(); err != nil {
				_ = os.RemoveAll(dir)
				return nil, err
			}
		}
		listen = "127.0.0.1"
	}
	in := &Instance{Source: "local", DataDir: data, bin: bin, as: as, args: []string{
		"-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=" + listen,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=300",
		"-c", "shared_buffers=256MB",
	}}
	if err := in.startServer(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	q := url.Values{"sslmode": {"disable"}}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/postgres"}
	if opts.TCP {
		u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	} else {
		q.Set("host", dir)
		q.Set("port", strconv.Itoa(port))
	}
	u.RawQuery = q.Encode()
	in.URL = u.String()
	in.stop = func(ctx context.Context) error {
		err := in.stopServer(ctx, syscall.SIGQUIT)
		if rerr := os.RemoveAll(dir); err == nil {
			err = rerr
		}
		return err
	}
	return in, nil
}

// startServer starts the postmaster, a child of ours, and returns once it
// accepts connections (as pg_ctl -w does: its postmaster.pid says "ready"),
// or with the server log when it exits first. When ctx ends first, the
// server is stopped.
func (in *Instance) startServer(ctx context.Context) error {
	dir := filepath.Dir(in.DataDir)
	logPath := filepath.Join(dir, "server.log")
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := in.as.command(context.Background(), filepath.Join(in.bin, "postgres"), in.args...)
	cmd.Stdout, cmd.Stderr = log, log
	p, err := StartTied(cmd, syscall.SIGQUIT)
	log.Close()
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	in.mu.Lock()
	in.proc = p
	in.mu.Unlock()
	pidFile := filepath.Join(in.DataDir, "postmaster.pid")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// postmaster.pid: its PID, ..., and on line 8 its status.
		if b, err := os.ReadFile(pidFile); err == nil {
			lines := strings.Split(string(b), "\n")
			if len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(p.Pid()) && strings.TrimSpace(lines[7]) == "ready" {
				return nil
			}
		}
		select {
		case <-p.Done():
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited (%v) before accepting connections; server log: %s", p.Err(), strings.TrimSpace(string(b)))
		case <-ctx.Done():
			_ = in.stopServer(context.Background(), syscall.SIGQUIT)
			return fmt.Errorf("postgres did not accept connections in time: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// stopServer sends the postmaster sig and waits for it to exit (killing it
// when ctx ends first).
func (in *Instance) stopServer(ctx context.Context, sig syscall.Signal) error {
	in.mu.Lock()
	p := in.proc
	in.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("stopping postgres: %w", err)
	}
	select {
	case <-p.Done():
		return nil
	case <-ctx.Done():
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		return fmt.Errorf("postgres did not stop in time, killed: %w", ctx.Err())
	}
}

// shutdownSignals are PostgreSQL's shutdown modes, as pg_ctl stop -m names
// them, and the signal that asks the postmaster for each.
var shutdownSignals = map[string]syscall.Signal{
	"smart":     syscall.SIGTERM,
	"fast":      syscall.SIGINT,
	"immediate": syscall.SIGQUIT, // a crash, to PostgreSQL: crash recovery at the next start
}

// Restart stops a local cluster's server in mode ("smart", "fast" or
// "immediate", as pg_ctl stop -m names them) and starts it again on the same
// data and port, for tests of faults. It fails for other sources.
func (in *Instance) Restart(ctx context.Context, mode string) error {
	if in.Source != "local" {
		return fmt.Errorf("pglaunch: restarting needs a local cluster, this one is from %s", in.Source)
	}
	sig, ok := shutdownSignals[mode]
	if !ok {
		return fmt.Errorf("pglaunch: unknown shutdown mode %q (smart, fast or immediate)", mode)
	}
	if err := in.stopServer(ctx, sig); err != nil {
		return err
	}
	return in.startServer(ctx)
}

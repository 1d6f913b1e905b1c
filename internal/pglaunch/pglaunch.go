// Package pglaunch gets a PostgreSQL to talk to on any machine: a URL from
// the environment, a container when the caller supplies a way to start one
// (the integration tests use testcontainers-go; this package depends on
// nothing but the standard library, so the library module stays lean), or a
// throwaway cluster made with the installed server binaries. The test suites
// and the CLI's demo use it.
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

	bin  string // a local cluster's server binaries
	stop func(context.Context) error
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
// server binaries (initdb, pg_ctl, postgres) for local clusters, e.g. another
// PostgreSQL version's; when set, Start tries no container. Unset: initdb and
// pg_ctl on PATH, else the newest /usr/lib/postgresql/*/bin.
const BinDirEnv = "PGRATELIMIT_PG_BIN"

// binDir finds the directory of initdb and pg_ctl.
func binDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err != nil {
			return "", fmt.Errorf("%w in %s=%s: %w", ErrNoServerBinaries, BinDirEnv, dir, err)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("%w: initdb and pg_ctl are not on PATH nor in /usr/lib/postgresql/*/bin", ErrNoServerBinaries)
	}
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return found[0], nil
}

// runAs runs a server binary, as the postgres OS user when we are root
// (initdb refuses to run as root).
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

func (r runAs) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	cmd.Dir = os.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second // a child that keeps the output open must not hang us
	if err := cmd.Run(); err != nil {
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

// startLocal makes a throwaway cluster in a temporary directory, with fsync
// off, listening on a unix socket in that directory.
func startLocal(ctx context.Context, opts Options) (*Instance, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgratelimit-pg-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	as, err := newRunAs(dir)
	if err != nil {
		cleanup()
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := as.run(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		cleanup()
		return nil, err
	}
	listen, port := "", 5432
	if opts.TCP {
		if port = opts.Port; port == 0 {
			if port, err = freePort(); err != nil {
				cleanup()
				return nil, err
			}
		}
		listen = "127.0.0.1"
	}
	serverOpts := strings.Join([]string{
		"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=" + quoteOpt(listen),
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=300",
		"-c", "shared_buffers=256MB",
	}, " ")
	if err := as.run(ctx, filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "server.log"),
		"-w", "-t", "60", "-o", serverOpts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		cleanup()
		return nil, fmt.Errorf("%w; server log: %s", err, strings.TrimSpace(string(log)))
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
	in := &Instance{URL: u.String(), Source: "local", DataDir: data, bin: bin}
	in.stop = func(ctx context.Context) error {
		err := as.run(ctx, filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		cleanup()
		return err
	}
	return in, nil
}

// quoteOpt quotes a server option value for pg_ctl -o.
func quoteOpt(s string) string { return "'" + s + "'" }

// PgCtl runs pg_ctl with args against a local cluster (e.g. "restart", "-m",
// "fast"), for tests of faults. It fails for other sources.
func (in *Instance) PgCtl(ctx context.Context, args ...string) error {
	if in.Source != "local" {
		return fmt.Errorf("pglaunch: pg_ctl needs a local cluster, this one is from %s", in.Source)
	}
	as, err := newRunAs(filepath.Dir(in.DataDir))
	if err != nil {
		return err
	}
	// -l: a restarted server must not inherit pg_ctl's output, which run
	// captures through a pipe that would then never close.
	logFile := filepath.Join(filepath.Dir(in.DataDir), "server.log")
	return as.run(ctx, filepath.Join(in.bin, "pg_ctl"), append([]string{"-D", in.DataDir, "-w", "-l", logFile}, args...)...)
}

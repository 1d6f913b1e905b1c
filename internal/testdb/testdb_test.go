package testdb

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
)

func TestMain(m *testing.M) { Main(m) }

// helperEnv makes the test binary a holder of servers (TestHelperServers)
// instead of a test run.
const helperEnv = "PGRATELIMIT_TESTDB_HELPER"

// Every server a test binary starts (the shared one, a cluster of a test's
// own, restarted, and a PgBouncer) dies with the binary when it is killed
// with SIGKILL: no cleanup runs, yet no process of it is left.
func TestServersDieWithTheTestBinary(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's: elsewhere a killed test binary leaves its servers")
	}
	Instance(t) // skip or fail like the other tests when there is no PostgreSQL at all
	// The helper's temporary directories (its clusters', PgBouncer's), left
	// behind by the kill, go in one of ours, which the postgres OS user can
	// reach.
	tmp, err := os.MkdirTemp("", "pgratelimit-killed-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServers$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=1", EnvVar+"=", "TMPDIR="+tmp)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The helper prints "holding" once its servers run.
	holding := false
	for sc := bufio.NewScanner(out); !holding && sc.Scan(); {
		holding = sc.Text() == "holding"
	}
	if !holding {
		_ = cmd.Wait()
		t.Fatal("the helper ended without starting its servers")
	}
	procs := descendants(cmd.Process.Pid)
	var postmasters, pgbouncers, backends int
	for _, p := range procs {
		switch {
		case p.ppid == cmd.Process.Pid && p.comm == "postgres":
			postmasters++
		case p.ppid == cmd.Process.Pid && p.comm == "pgbouncer":
			pgbouncers++
		case p.comm == "postgres":
			backends++
		}
	}
	t.Logf("the helper runs %d postmasters (%d processes under them) and %d PgBouncer", postmasters, backends, pgbouncers)
	if postmasters != 2 || backends < 2 {
		t.Fatalf("the helper runs %d postmasters and %d processes under them; want its 2 and their backends: %+v", postmasters, backends, procs)
	}
	if _, err := exec.LookPath("pgbouncer"); err == nil && pgbouncers != 1 {
		t.Fatalf("the helper runs %d PgBouncers; want 1: %+v", pgbouncers, procs)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// They go at once; the bound is only there for a test that fails to end.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var left []proc
		for _, p := range procs {
			if p.alive() {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
			t.Fatalf("left running after the test binary was killed: %+v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Their directories stay behind; the next to make one of their kind
	// removes them.
	t.Setenv("TMPDIR", tmp)
	for pattern, want := range map[string]int{"pgratelimit-pg-": postmasters, "pgratelimit-pgbouncer-": pgbouncers} {
		stale, _ := filepath.Glob(filepath.Join(tmp, pattern+"*"))
		if len(stale) != want {
			t.Errorf("%s: the killed binary left %v; want %d", pattern, stale, want)
		}
		d, err := pglaunch.TempDir(pattern)
		if err != nil {
			t.Fatal(err)
		}
		if now, _ := filepath.Glob(filepath.Join(tmp, pattern+"*")); len(now) != 1 || now[0] != d {
			t.Errorf("%s: the killed binary's %v; after a new one, %v", pattern, stale, now)
		}
	}
}

// TestHelperServers is the server holder of TestServersDieWithTheTestBinary:
// it starts the shared server, a cluster of its own (restarted once), a
// PgBouncer when installed, with a connection open to each server, says so
// and waits to be killed. It does nothing in a test run.
func TestHelperServers(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("a helper process of TestServersDieWithTheTestBinary")
	}
	ctx := context.Background()
	own := NewCluster(t, pglaunch.Options{TCP: true})
	if err := own.Restart(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	urls := []string{Instance(t).URL, own.URL}
	if _, err := exec.LookPath("pgbouncer"); err == nil {
		urls = append(urls, PgBouncer(t))
	}
	for _, u := range urls {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("holding")
	time.Sleep(time.Hour)
}

// proc is a process, told from a later one with its PID by its start time.
type proc struct {
	pid, ppid int
	comm      string
	start     string
}

// readProc reads /proc/PID/stat; ok is false for a process gone or a zombie.
func readProc(pid int) (p proc, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return p, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return p, false
	}
	f := strings.Fields(s[end+1:]) // state, ppid, ... starttime is the 20th
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return p, false
	}
	p.pid, p.comm, p.start = pid, s[open+1:end], f[19]
	p.ppid, _ = strconv.Atoi(f[1])
	return p, true
}

func (p proc) alive() bool {
	now, ok := readProc(p.pid)
	return ok && now.start == p.start
}

// descendants lists the live processes under pid.
func descendants(pid int) []proc {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]proc{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(n); ok {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []proc
	var walk func(int)
	walk = func(pid int) {
		for _, c := range children[pid] {
			out = append(out, c)
			walk(c.pid)
		}
	}
	walk(pid)
	return out
}

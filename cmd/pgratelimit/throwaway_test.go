package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lockedBuffer collects a process's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDB runs `pgratelimit db args...` as a process of its own, with env
// added to the test's environment, and returns it, its stdout line by line
// and its stderr. Without server binaries to start a PostgreSQL with, the
// test is skipped (failed when CI is set).
func startDB(t *testing.T, env []string, args ...string) (*exec.Cmd, *bufio.Scanner, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"db"}, args...)...)
	cmd.Env = append(append(os.Environ(), cliEnv+"=1"), env...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
			}
		}
	})
	return cmd, bufio.NewScanner(out), stderr
}

var dbLine = regexp.MustCompile(`^DATABASE_URL=(postgres://postgres@127\.0\.0\.1:(\d+)/postgres)$`)

// pgratelimit db: one line on stdout that a shell can export, the database
// migrated and usable by the other commands, what to do on stderr; Ctrl-C
// stops it (exit 0) and removes it.
func TestDB(t *testing.T) {
	t.Parallel()
	cmd, out, stderr := startDB(t, nil)
	if !out.Scan() {
		err := cmd.Wait()
		if strings.Contains(stderr.String(), "no PostgreSQL server binaries") && os.Getenv("CI") == "" {
			t.Skipf("no PostgreSQL server binaries: %s", stderr)
		}
		t.Fatalf("pgratelimit db printed nothing on stdout (%v):\n%s", err, stderr)
	}
	m := dbLine.FindStringSubmatch(out.Text())
	require.NotNil(t, m, "stdout's line %q", out.Text())
	url := m[1]
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "until Ctrl-C") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // stderr follows the stdout line
	}
	require.Regexp(t, `^Starting a throwaway PostgreSQL\.\.\.
PostgreSQL \d+\.\d+ on 127\.0\.0\.1:`+m[2]+`, with pgratelimit's tables\. In another shell:
    export DATABASE_URL=`+regexp.QuoteMeta(url)+`
    pgratelimit allow user-1
It runs until Ctrl-C, which stops it and removes its data\.
$`, stderr.String())

	// The shell reads the line as one assignment, unquoted.
	sh, err := exec.Command("sh", "-c", out.Text()+`; printf %s "$DATABASE_URL"`).Output()
	require.NoError(t, err)
	require.Equal(t, url, string(sh))

	// The migrations are applied: the commands work at once.
	code, stdout, errOut := pgrl(url, "migrate", "status")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, stdout, "pending")
	code, stdout, errOut = pgrl(url, "allow", "user-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, stdout, `allowed: took 1 token from "user-1": 9 of 10 left`)

	// Ctrl-C: exit 0, the server stopped and its data removed.
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	require.False(t, out.Scan(), "one line on stdout: %q", out.Text())
	require.NoError(t, cmd.Wait(), stderr.String())
	require.True(t, strings.HasSuffix(stderr.String(), "\nStopped the throwaway PostgreSQL and removed its data.\n"), stderr.String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "the server is stopped")
}

// --port chooses the port; a taken one, or no server binaries, is said in
// the user's terms.
func TestDBPortAndErrors(t *testing.T) {
	t.Parallel()
	code, _, stderr := pgrl("", "db", "--port", "70000")
	require.Equal(t, 2, code)
	require.Equal(t, "pgratelimit db: --port must be between 0 and 65535, got 70000\n"+
		"usage: pgratelimit db [--port N]\nRun 'pgratelimit db --help' for its flags.\n", stderr)

	t.Run("no server binaries", func(t *testing.T) {
		t.Parallel()
		cmd, out, stderr := startDB(t, []string{"PGRATELIMIT_PG_BIN=" + t.TempDir()})
		require.False(t, out.Scan())
		require.Error(t, cmd.Wait())
		require.Equal(t, 2, cmd.ProcessState.ExitCode())
		require.Contains(t, stderr.String(), "pgratelimit db: cannot start a throwaway PostgreSQL: no PostgreSQL server binaries in PGRATELIMIT_PG_BIN=")
		require.Contains(t, stderr.String(), "install PostgreSQL's server (Debian, Ubuntu: apt-get install postgresql;")
	})

	t.Run("a port of our choosing, then taken", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())

		cmd, out, stderr := startDB(t, nil, "--port", strconv.Itoa(port))
		if !out.Scan() {
			err := cmd.Wait()
			if strings.Contains(stderr.String(), "no PostgreSQL server binaries") && os.Getenv("CI") == "" {
				t.Skipf("no PostgreSQL server binaries: %s", stderr)
			}
			t.Fatalf("pgratelimit db --port %d printed nothing on stdout (%v):\n%s", port, err, stderr)
		}
		require.Equal(t, "DATABASE_URL=postgres://postgres@127.0.0.1:"+strconv.Itoa(port)+"/postgres", out.Text())

		taken, _, stderr2 := startDB(t, nil, "--port", strconv.Itoa(port))
		require.Error(t, taken.Wait())
		require.Equal(t, 2, taken.ProcessState.ExitCode())
		require.Equal(t, "Starting a throwaway PostgreSQL...\n"+
			"pgratelimit db: port "+strconv.Itoa(port)+" of 127.0.0.1 is taken: choose another (or 0: a free one)\n", stderr2.String())

		require.NoError(t, cmd.Process.Signal(os.Interrupt))
		require.NoError(t, cmd.Wait(), stderr.String())
	})
}

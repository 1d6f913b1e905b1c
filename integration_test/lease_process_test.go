package integration

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// leaseHelperEnv, set to a database URL, makes the test binary a lease
// holder (TestLeaseHelperProcess) instead of a test run.
const leaseHelperEnv = "PGRATELIMIT_LEASE_HELPER_URL"

const (
	helperMax = 3
	helperTTL = 2 * time.Second
)

// A process that holds leases and is killed (SIGKILL: no release, no
// goodbye) loses them at their TTL: until then its units are held, right
// after it they are free, with no cleanup run.
func TestLeaseKilledProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sch := testdb.NewSchema(t)
	pool := sch.Pool(t, 4)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "proc", Max: helperMax, TTL: helperTTL})

	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), leaseHelperEnv+"="+sch.URL(t), "PGRATELIMIT_TEST_MODE=per-check")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The helper prints "acquired <expiry>" once it holds every unit.
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "acquired ") {
				lines <- sc.Text()
				return
			}
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatal("the helper process did not acquire its leases")
	}
	require.NotEmpty(t, line, "the helper process ended without its leases")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed := time.Now()
	expiry, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(line, "acquired "))
	require.NoError(t, err)

	r, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, r.Allowed, "the dead process's leases still count")
	require.Equal(t, int64(helperMax), r.Limit-r.Remaining)

	// Back at their expiry (a waiter polls then): the bound is generous,
	// only there to fail rather than wait for ever.
	wctx, cancel := context.WithTimeout(ctx, helperTTL+30*time.Second)
	defer cancel()
	r, err = s.Wait(wctx, "k", helperMax)
	require.NoError(t, err, "every unit back after the TTL")
	require.True(t, r.Allowed)
	require.False(t, r.Lease.AcquiredAt.Before(expiry), "not before the dead leases expired")
	t.Logf("units back %s after the kill, %s after the leases' expiry", time.Since(killed).Round(time.Millisecond),
		r.Lease.AcquiredAt.Sub(expiry).Round(time.Millisecond))
}

// TestLeaseHelperProcess is the lease holder of TestLeaseKilledProcess: it
// takes every unit of key "k", prints when they expire, and waits to be
// killed. It does nothing in a test run.
func TestLeaseHelperProcess(t *testing.T) {
	url := os.Getenv(leaseHelperEnv)
	if url == "" {
		t.Skip("a helper process of TestLeaseKilledProcess")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	s, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "proc", Max: helperMax, TTL: helperTTL})
	require.NoError(t, err)
	var last time.Time
	for range helperMax {
		r, err := s.Acquire(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		last = r.Lease.ExpiresAt
	}
	_, err = os.Stdout.WriteString("acquired " + last.Format(time.RFC3339Nano) + "\n")
	require.NoError(t, err)
	time.Sleep(time.Hour)
}

package integration

// Load without faults: many goroutines on a few keys, for a while, and not
// one error. A transaction that notifies (a release from a full key, an
// alert) waits at COMMIT for PostgreSQL's notification queue lock, which a
// lock_timeout of ours must not cut short (issue 40: a coalesced batch's
// InsertGuard did, and callers saw ErrLockTimeout with no lock timeout
// configured).
//
// PGRATELIMIT_LOAD_SECONDS sets how long each run lasts (default 3): the
// issue's check is 60.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// loadDuration is how long each load run lasts.
func loadDuration(t *testing.T) time.Duration {
	s := os.Getenv("PGRATELIMIT_LOAD_SECONDS")
	if s == "" {
		return 3 * time.Second
	}
	n, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err, "PGRATELIMIT_LOAD_SECONDS")
	return time.Duration(n * float64(time.Second))
}

// loadPools are the pools of a load run: direct, and through a PgBouncer in
// transaction mode.
func loadPools(t *testing.T) map[string]func(t *testing.T) *pgxpool.Pool {
	return map[string]func(t *testing.T) *pgxpool.Pool{
		"direct":    func(t *testing.T) *pgxpool.Pool { return newPool(t) },
		"pgbouncer": pgbouncerPool,
	}
}

// hammerFor runs work on workers goroutines until d has passed and fails
// the test with the errors they met (the first few of them).
func hammerFor(t *testing.T, workers int, d time.Duration, work func(ctx context.Context, w int, rng *rand.Rand) error) (calls int64) {
	t.Helper()
	ctx := context.Background()
	stop := time.Now().Add(d)
	var (
		n    atomic.Int64
		mu   sync.Mutex
		errs []error
		bad  int
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 40))
			for time.Now().Before(stop) {
				err := work(ctx, w, rng)
				n.Add(1)
				if err != nil {
					mu.Lock()
					if bad++; len(errs) < 5 {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, bad, "%d of %d calls failed, first: %v", bad, n.Load(), errs)
	return n.Load()
}

// 64 goroutines on 4 keys of a semaphore of Max 3 and TTL 1s: Acquire,
// hold 0-20ms, Release. No call fails, and no key ever holds more than Max.
// A release is ErrLeaseExpired only when more than the TTL passed since its
// Acquire was called (a machine this busy may stall a goroutine that long):
// that is its right answer.
func TestLeaseLoad(t *testing.T) {
	t.Parallel()
	d := loadDuration(t)
	for name, mk := range loadPools(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const ttl = time.Second
			s := newSemaphore(t, mk(t), pgratelimit.SemaphoreConfig{Prefix: "load", Max: 3, TTL: ttl})
			var acquired, late atomic.Int64
			calls := hammerFor(t, 64, d, func(ctx context.Context, w int, rng *rand.Rand) error {
				key := fmt.Sprintf("k%d", w%4)
				start := time.Now()
				r, err := s.Acquire(ctx, key, 1)
				took := time.Since(start)
				switch {
				case err != nil:
					return fmt.Errorf("acquire: %w", err)
				case r.Limit-r.Remaining > 3:
					return fmt.Errorf("%s holds %d of Max 3", key, r.Limit-r.Remaining)
				case !r.Allowed:
					return nil
				}
				acquired.Add(1)
				time.Sleep(time.Duration(rng.IntN(21)) * time.Millisecond)
				rel := time.Now()
				err = s.Release(ctx, key, r.Lease.ID)
				if errors.Is(err, pgratelimit.ErrLeaseExpired) && time.Since(start) >= ttl {
					// The right answer, not a failure: the machine stalled
					// us past the TTL between the acquisition's lock (after
					// start) and the release's (before now).
					late.Add(1)
					return nil
				}
				if err != nil {
					return fmt.Errorf("release (acquire took %s, release %s): %w", took, time.Since(rel), err)
				}
				return nil
			})
			require.Positive(t, acquired.Load())
			t.Logf("%d acquisitions in %d calls over %s; %d released more than the TTL after the Acquire call (ErrLeaseExpired)", acquired.Load(), calls, d, late.Load())
		})
	}
}

// The same load on a limiter with alerts whose periods are short, so that
// many of its transactions write events and notify: no call fails.
func TestAlertLoad(t *testing.T) {
	t.Parallel()
	d := loadDuration(t)
	for name, mk := range loadPools(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := mk(t)
			// Periods of 100ms (Capacity 10, Refill 10 every 100ms): every
			// key fires its three lines each period.
			l := alertLimiter(t, pool, pgratelimit.Config{Prefix: "aload", Capacity: 10, Refill: 10, Interval: 100 * time.Millisecond,
				Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.5, 1}, Exhausted: true}})
			var allowed atomic.Int64
			hammerFor(t, 64, d, func(ctx context.Context, w int, rng *rand.Rand) error {
				r, err := l.AllowN(ctx, fmt.Sprintf("k%d", w%4), 1)
				if err != nil {
					return err
				}
				if r.Allowed {
					allowed.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				return nil
			})
			require.Positive(t, allowed.Load())
			require.NotEmpty(t, listEvents(t, pool, "aload"))
		})
	}
}

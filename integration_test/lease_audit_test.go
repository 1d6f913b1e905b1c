package integration

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
)

// The exactness of leases under concurrency and faults: 64 holders over a
// few keys acquire (with request IDs, retrying after errors until they get
// an answer), hold for random times (extending the longer holds), release,
// and now and then abandon a lease; meanwhile backends are terminated (or,
// through PgBouncer, calls cut short by deadlines). Two audits:
//
//   - every holder's interval, from when its Acquire returned to when its
//     first Release began (or its lease's last known expiry, if sooner):
//     the lease surely counted over it, so at no instant may the intervals
//     of a key hold more than Max units;
//   - a monitor that reads the table again and again: the live leases of a
//     key never hold more than Max units.
//
// Then every key is filled with leases that are abandoned: their units come
// back within TTL + 1s.

const (
	auditMax     = 3
	auditTTL     = time.Second
	auditHolders = 64
	auditFor     = 3 * time.Second
	// slack is how much the database's clock and the test's may disagree
	// (one machine: the same clock, read at slightly different moments).
	slack = 5 * time.Millisecond
)

var auditKeys = []string{"k0", "k1", "k2", "k3"}

// interval is a span during which a lease of weight surely counted.
type interval struct {
	key        string
	weight     int64
	start, end time.Time
}

// auditRun is one run of the load.
type auditRun struct {
	s     *pgratelimit.Semaphore
	fault func() (context.Context, context.CancelFunc) // a call's context
	mu    sync.Mutex
	spans []interval
	stats struct{ acquired, denied, errs, abandoned, expired atomic.Int64 }
}

// leaseAudit runs the load on s (whose prefix is prefix) with calls made
// in fault's contexts, while faults runs (if not nil) until its channel is
// closed; monitor reads the table through admin.
func leaseAudit(t *testing.T, s *pgratelimit.Semaphore, admin *pgxpool.Pool, fault func() (context.Context, context.CancelFunc), faults func(stop chan struct{})) {
	t.Helper()
	run := &auditRun{s: s, fault: fault}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	violations := make(chan string, 16)
	wg.Go(func() { monitor(admin, s.Config().Prefix, stop, violations) })
	if faults != nil {
		wg.Go(func() { faults(stop) })
	}
	var holders sync.WaitGroup
	for h := range auditHolders {
		holders.Go(func() { run.holder(h, stop) })
	}
	time.Sleep(auditFor)
	close(stop)
	holders.Wait()
	wg.Wait()
	close(violations)
	for v := range violations {
		t.Error(v)
	}
	run.audit(t)
	t.Logf("acquired %d, denied %d, errors %d, abandoned %d, lost to the TTL %d", run.stats.acquired.Load(), run.stats.denied.Load(),
		run.stats.errs.Load(), run.stats.abandoned.Load(), run.stats.expired.Load())
	require.Positive(t, run.stats.acquired.Load())
	require.Positive(t, run.stats.denied.Load(), "the keys were contended")
	comeBack(t, s)
}

// holder acquires, holds and releases until stop is closed.
func (run *auditRun) holder(h int, stop chan struct{}) {
	rng := mrand.New(mrand.NewPCG(uint64(h), uint64(time.Now().UnixNano())))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		key := auditKeys[rng.IntN(len(auditKeys))]
		weight := int64(1 + rng.IntN(2))
		l, ok := run.acquire(fmt.Sprintf("h%d-%d", h, n), key, weight, stop)
		if !ok {
			time.Sleep(time.Duration(1+rng.IntN(10)) * time.Millisecond)
			continue
		}
		start := time.Now()
		if rng.IntN(40) == 0 {
			// Abandoned: it surely counts until its expiry.
			run.stats.abandoned.Add(1)
			run.add(interval{key, weight, start, l.ExpiresAt.Add(-slack)})
			continue
		}
		end := run.hold(rng, l, stop)
		run.add(interval{key, weight, start, end})
	}
}

// acquire acquires weight units of key with request ID id, trying again
// after errors until it gets an answer (the same lease, if a try whose
// answer was lost took one).
func (run *auditRun) acquire(id, key string, weight int64, stop chan struct{}) (pgratelimit.Lease, bool) {
	for {
		ctx, cancel := run.fault()
		r, err := run.s.Acquire(pgratelimit.WithRequestID(ctx, id), key, weight)
		cancel()
		switch {
		case err == nil && r.Allowed:
			run.stats.acquired.Add(1)
			return r.Lease, true
		case err == nil:
			run.stats.denied.Add(1)
			return pgratelimit.Lease{}, false
		}
		run.stats.errs.Add(1)
		select {
		case <-stop:
			// Its lease may exist: it counts until its TTL, unknown here.
			return pgratelimit.Lease{}, false
		default:
			time.Sleep(time.Millisecond)
		}
	}
}

// hold holds l for a random time (mostly short, a tenth up to 1.5 TTL),
// extending it every TTL/3, then releases
// it; it returns when the lease surely stopped counting at the latest: the
// start of its first Release, or its last known expiry.
func (run *auditRun) hold(rng *mrand.Rand, l pgratelimit.Lease, stop chan struct{}) time.Time {
	d := time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
	if rng.IntN(10) == 0 {
		d = time.Duration(rng.Int64N(int64(auditTTL * 3 / 2))) // extended, maybe past the TTL
	}
	until := time.Now().Add(d)
	expires := l.ExpiresAt
	for time.Now().Before(until) {
		select {
		case <-stop:
			until = time.Now()
		case <-time.After(min(auditTTL/3, time.Until(until))):
		}
		if time.Until(until) <= 0 {
			break
		}
		ctx, cancel := run.fault()
		e, err := run.s.Extend(ctx, l.Key, l.ID)
		cancel()
		if err == nil {
			expires = e.ExpiresAt
		}
	}
	end := time.Now()
	for try := 0; ; try++ {
		ctx, cancel := run.fault()
		err := run.s.Release(ctx, l.Key, l.ID)
		cancel()
		if err == nil || errors.Is(err, pgratelimit.ErrLeaseExpired) || try == 50 {
			if errors.Is(err, pgratelimit.ErrLeaseExpired) {
				run.stats.expired.Add(1)
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	if e := expires.Add(-slack); e.Before(end) {
		return e
	}
	return end
}

func (run *auditRun) add(iv interval) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.spans = append(run.spans, iv)
}

// audit checks that at no instant the intervals of a key hold more than
// Max units.
func (run *auditRun) audit(t *testing.T) {
	t.Helper()
	type edge struct {
		at time.Time
		w  int64
	}
	byKey := map[string][]edge{}
	for _, iv := range run.spans {
		if iv.end.After(iv.start) {
			byKey[iv.key] = append(byKey[iv.key], edge{iv.start, iv.weight}, edge{iv.end, -iv.weight})
		}
	}
	for key, es := range byKey {
		// Ends before starts at the same instant: intervals are half open.
		slices.SortFunc(es, func(a, b edge) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return int(a.w - b.w)
		})
		var held int64
		for _, e := range es {
			if held += e.w; held > auditMax {
				t.Errorf("key %s: %d units surely held at %s, max %d", key, held, e.at.Format(time.RFC3339Nano), auditMax)
				break
			}
		}
	}
}

// monitor reads the live leases of prefix until stop is closed, and reports
// a key whose live leases hold more than Max units.
func monitor(admin *pgxpool.Pool, prefix string, stop chan struct{}, violations chan<- string) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rows, err := admin.Query(ctx, `SELECT b.key, sum((l->>'weight')::bigint)
FROM pgratelimit_buckets b, json_array_elements(b.leases) l
WHERE b.prefix = $1 AND (l->>'expires_at')::timestamptz > clock_timestamp() GROUP BY b.key HAVING sum((l->>'weight')::bigint) > $2`, prefix, auditMax)
		if err == nil {
			for rows.Next() {
				var key string
				var held int64
				if rows.Scan(&key, &held) == nil {
					select {
					case violations <- fmt.Sprintf("monitor: key %s: live leases hold %d units, max %d", key, held, auditMax):
					default:
					}
				}
			}
			rows.Close()
		}
		cancel()
	}
}

// comeBack fills every key with leases and abandons them: Wait gets a unit
// of each key once they expire (the bound, TTL + 30s, only against a hang:
// a busy machine takes seconds more than the TTL).
func comeBack(t *testing.T, s *pgratelimit.Semaphore) {
	t.Helper()
	ctx := context.Background()
	time.Sleep(auditTTL + slack) // the load's leases are gone by now
	var wg sync.WaitGroup
	for _, key := range auditKeys {
		wg.Go(func() {
			var last time.Time
			for range auditMax {
				r, err := s.Acquire(ctx, key, 1)
				if err != nil || !r.Allowed {
					t.Errorf("key %s: filling: %+v, %v", key, r, err)
					return
				}
				last = r.Lease.ExpiresAt
			}
			start := time.Now()
			wctx, cancel := context.WithTimeout(ctx, auditTTL+30*time.Second)
			defer cancel()
			r, err := s.Wait(wctx, key, 1)
			if err != nil || !r.Allowed {
				t.Errorf("key %s: the abandoned units did not come back within TTL + 30s: %+v, %v", key, r, err)
				return
			}
			if r.Lease.AcquiredAt.Before(last.Add(-auditTTL)) {
				t.Errorf("key %s: acquired at %s, before the abandoned leases expired", key, r.Lease.AcquiredAt)
			}
			t.Logf("key %s: a unit came back %s after the last abandoned lease, %s after its expiry", key,
				time.Since(start).Round(time.Millisecond), r.Lease.AcquiredAt.Sub(last).Round(time.Millisecond))
		})
	}
	wg.Wait()
}

// Under terminated backends, in the suite's coalescing mode.
func TestLeaseAuditUnderFaults(t *testing.T) {
	t.Parallel()
	skipOnDistributed(t, "terminates the backends of one server")
	sch := testdb.NewSchema(t)
	cfg := sch.Config.Copy()
	app := "lease-" + randomHex()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 40
	pool := sch.PoolWithConfig(t, cfg)
	admin := sch.Pool(t, 4)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "audit", Max: auditMax, TTL: auditTTL})
	callCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 2*time.Second)
	}
	leaseAudit(t, s, admin, callCtx, func(stop chan struct{}) {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+mrand.IntN(80)) * time.Millisecond):
			}
			_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND backend_type = 'client backend' AND random() < 0.3`, app)
		}
	})
}

// Through PgBouncer in transaction mode, with short deadlines on a tenth
// of the calls (pgx cancels the statements in flight); no terminated
// backends: PgBouncer 1.18 exits when a server connection it reads a
// pipeline from is terminated.
func TestLeaseAuditThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pool := pgbouncerPool(t)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "audit", Max: auditMax, TTL: auditTTL})
	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(1, 2))
	callCtx := func() (context.Context, context.CancelFunc) {
		mu.Lock()
		n, d := rng.IntN(10), time.Duration(rng.IntN(3000))*time.Microsecond
		mu.Unlock()
		if n == 0 {
			return context.WithTimeout(context.Background(), d)
		}
		return context.WithTimeout(context.Background(), 2*time.Second)
	}
	leaseAudit(t, s, pool, callCtx, nil)
}

// On Citus, with the tables distributed by key (skipped without a
// cluster).
func TestLeaseAuditCitus(t *testing.T) {
	t.Parallel()
	pool := citusPool(t, 40)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "audit", Max: auditMax, TTL: auditTTL})
	callCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 2*time.Second)
	}
	leaseAudit(t, s, pool, callCtx, nil)
}

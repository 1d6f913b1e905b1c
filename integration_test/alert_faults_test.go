package integration

// Usage alerts under concurrency and faults: each line's event exists once
// per key and period, and only if the charge that crossed it committed.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
	"github.com/stretchr/testify/require"
)

// hammerConfig is the limiter the hammer charges: a monthly quota of 1000
// with lines at a quarter, a half, three quarters, 90% and 100% used, the
// balance at 100 and at 0, and Exhausted.
func hammerConfig(clock *fakeClock) pgratelimit.Config {
	return pgratelimit.Config{Prefix: "h", Capacity: 1000, Refill: 1000, Clock: clock.Now,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, LockTimeout: 10 * time.Second,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.25, 0.5, 0.75, 0.9, 1}, BalanceAtOrBelow: []int64{100, 0}, Exhausted: true}}
}

var hammerKeys = []string{"a", "b", "c", "d"}

// alertHammer runs 64 goroutines of checks (a few as AllowAll over two
// keys), each with a request ID, the first try of each in a context from
// fault, then retried until answered; it returns the keys that were denied
// a charge.
func alertHammer(t *testing.T, l *pgratelimit.Limiter, seed uint64, fault func() (context.Context, context.CancelFunc)) map[string]bool {
	var mu sync.Mutex
	denied := map[string]bool{}
	var wg sync.WaitGroup
	var retries atomic.Int64
	defer func() { t.Logf("%d retries", retries.Load()) }()
	for w := range 64 {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(seed, uint64(w)))
			for i := range 8 {
				id := fmt.Sprintf("g%d-%d", w, i)
				a, b := hammerKeys[rng.IntN(4)], hammerKeys[rng.IntN(4)]
				cs, keys := []pgratelimit.Charge{l.Charge(a, 1+rng.Int64N(40))}, []string{a}
				if a != b && rng.IntN(8) == 0 {
					cs, keys = append(cs, l.Charge(b, 1+rng.Int64N(40))), append(keys, b)
				}
				m := untilAnswered(t, cs, id, fault, &retries)
				mu.Lock()
				for j, r := range m.Results {
					if !r.Allowed {
						denied[keys[j]] = true
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return denied
}

// untilAnswered runs AllowAll of cs with request ID id, first in a context
// from fault, then in plain ones until it is answered.
func untilAnswered(t *testing.T, cs []pgratelimit.Charge, id string, fault func() (context.Context, context.CancelFunc), retries *atomic.Int64) pgratelimit.MultiResult {
	for try := 0; ; try++ {
		if try > 0 {
			retries.Add(1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if try == 0 {
			ctx, cancel = fault()
		}
		m, err := pgratelimit.AllowAll(pgratelimit.WithRequestID(ctx, id), cs...)
		cancel()
		if err == nil {
			return m
		}
		// Faults end (terminations come only after progress, deadlines only
		// on first tries): a request still failing after this many tries
		// fails for another reason.
		require.Less(t, try, 1000, "request %s: %v", id, err)
		time.Sleep(2 * time.Millisecond)
	}
}

// auditHammer checks each key's events of the period starting at start
// against its balance: every line the balance is past has exactly one
// event, fired by a charge whose request is recorded (committed) with the
// event's balance and that crossed the line; no other line has one;
// Exhausted exists once if a charge of the key was denied.
func auditHammer(t *testing.T, l *pgratelimit.Limiter, pool *pgxpool.Pool, start time.Time, denied map[string]bool) {
	ctx := context.Background()
	all := listEvents(t, pool, "h")
	for _, k := range hammerKeys {
		r, err := l.Peek(ctx, k)
		require.NoError(t, err)
		spent := 1000 - r.Remaining
		var want []line
		for _, f := range []float64{0.25, 0.5, 0.75, 0.9, 1} {
			if float64(spent) >= f*1000 {
				want = append(want, used(f))
			}
		}
		for _, lv := range []int64{100, 0} {
			if r.Remaining <= lv {
				want = append(want, below(lv))
			}
		}
		if denied[k] {
			want = append(want, exhausted())
		}
		var got []line
		for _, e := range all {
			if e.Key != k || !e.PeriodStart.Equal(start) {
				continue
			}
			got = append(got, lineOf(e))
			if e.Kind == events.Exhausted {
				continue
			}
			require.NotEmpty(t, e.RequestID, "%+v", e)
			rec, err := admin.LookupRequest(ctx, pool, "h", k, e.RequestID)
			require.NoError(t, err, "the request of %+v", e)
			require.Equal(t, e.Remaining, rec.Result.Remaining, "%+v", e)
			require.Equal(t, rec.Amount > 0, true)
			before := e.Remaining + rec.Amount
			switch e.Kind {
			case events.Used:
				require.True(t, float64(1000-before) < e.Fraction*1000 && float64(1000-e.Remaining) >= e.Fraction*1000, "%+v crossed by %d", e, rec.Amount)
			case events.Below:
				require.True(t, before > e.Level && e.Remaining <= e.Level, "%+v crossed by %d", e, rec.Amount)
			}
		}
		require.ElementsMatch(t, want, got, "key %s: used %d", k, spent)
	}
}

// alertsUnderFaults runs the hammer on pool (whose first tries fault makes
// fail), audits, then checks that refunds do not re-arm the lines and that
// the next month does.
func alertsUnderFaults(t *testing.T, pool, admin *pgxpool.Pool, fault func() (context.Context, context.CancelFunc)) {
	ctx := context.Background()
	clock := newClock()
	l := alertLimiter(t, pool, hammerConfig(clock))
	reader := alertLimiter(t, admin, hammerConfig(clock))
	jan := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	began := time.Now()
	denied := alertHammer(t, l, 1, fault)
	t.Logf("the hammer took %s", time.Since(began))
	auditHammer(t, reader, admin, jan, denied)
	n := len(listEvents(t, admin, "h"))

	// Refunds lift every key back above its lines; charges of as much cross
	// them again: nothing fires within the month.
	for _, k := range hammerKeys {
		r, err := reader.Peek(ctx, k)
		require.NoError(t, err)
		back := 1000 - r.Remaining
		if back == 0 {
			continue
		}
		_, err = reader.Refund(ctx, k, back)
		require.NoError(t, err)
		for _, c := range []int64{back / 2, back - back/2} {
			if c > 0 {
				r, err := reader.AllowN(ctx, k, c)
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
		}
	}
	require.Len(t, listEvents(t, admin, "h"), n, "refunds re-armed a line")

	// The next month fires them again.
	clock.Set(31*24*time.Hour + time.Hour)
	denied = alertHammer(t, l, 2, fault)
	auditHammer(t, reader, admin, time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), denied)
}

// Terminated backends: a background goroutine terminates the test's
// backends every few milliseconds while the hammer runs, but only once a
// request has begun since its last termination (each goroutine's next
// request begins when its last one is answered): on a machine too busy to
// answer between two terminations, a fixed pace would terminate every try.
func TestAlertsUnderTerminations(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	cfg := s.Config.Copy()
	app := "alerts-" + randomHex()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 16
	pool := s.PoolWithConfig(t, cfg)
	admin := s.Pool(t, 4)
	var begun atomic.Int64
	stop := make(chan struct{})
	var killer sync.WaitGroup
	killer.Go(func() {
		last := begun.Load()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(10+mrand.IntN(20)) * time.Millisecond):
			}
			n := begun.Load()
			if n == last {
				continue
			}
			last = n
			_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND backend_type = 'client backend'`, app)
		}
	})
	defer func() { close(stop); killer.Wait() }()
	alertsUnderFaults(t, pool, admin, func() (context.Context, context.CancelFunc) {
		begun.Add(1)
		return context.WithTimeout(context.Background(), 10*time.Second)
	})
}

// Through PgBouncer in transaction mode, with short deadlines on the first
// try of each check (not terminations: PgBouncer 1.18 exits when a server
// connection it reads a pipeline from is terminated).
func TestAlertsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pool := pgbouncerPool(t)
	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(7, 7))
	alertsUnderFaults(t, pool, pool, func() (context.Context, context.CancelFunc) {
		mu.Lock()
		d := time.Duration(rng.IntN(3000)) * time.Microsecond
		mu.Unlock()
		return context.WithTimeout(context.Background(), d)
	})

	// A consumer through PgBouncer: LISTEN does not work there, its probe
	// says so, and it delivers by polling.
	var logs syncBuffer
	runConsumer(t, pool, events.ConsumerConfig{PollInterval: 50 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: func(context.Context, pgx.Tx, events.Event) error { return nil }})
	waitDelivered(t, pool, "h", 10*time.Second)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "notifications do not arrive") }, 10*time.Second, 10*time.Millisecond)
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

package integration

// The Consumer: delivery at least once, retries, the handler's transaction,
// a consumer killed mid-delivery, consumers that share the work.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
	"github.com/stretchr/testify/require"
)

// emit writes n events of prefix: a limiter whose one line is 100% used,
// charged its whole capacity on n keys.
func emit(t *testing.T, pool *pgxpool.Pool, prefix string, n int) {
	t.Helper()
	l := alertLimiter(t, pool, pgratelimit.Config{Prefix: prefix, Capacity: 1, Refill: 1, Interval: time.Hour,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{1}}})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := l.Allow(context.Background(), fmt.Sprintf("k%03d", i))
			require.NoError(t, err)
			require.True(t, r.Allowed)
		})
	}
	wg.Wait()
}

// runConsumer runs a consumer of pool with cfg until the test ends or the
// returned cancel is called, and waits for it to stop.
func runConsumer(t *testing.T, pool *pgxpool.Pool, cfg events.ConsumerConfig) context.CancelFunc {
	t.Helper()
	c, err := events.NewConsumer(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		require.NoError(t, c.Run(ctx))
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// undelivered counts the events of prefix not delivered yet.
func undelivered(t *testing.T, pool *pgxpool.Pool, prefix string) int {
	t.Helper()
	n := 0
	for _, e := range listEvents(t, pool, prefix) {
		if e.DeliveredAt.IsZero() {
			n++
		}
	}
	return n
}

// waitDelivered waits until every event of prefix is delivered.
func waitDelivered(t *testing.T, pool *pgxpool.Pool, prefix string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return undelivered(t, pool, prefix) == 0 }, within, 10*time.Millisecond)
}

// A consumer woken by notifications delivers every event once, in ID order
// within a key, marked delivered; a handler's error is retried after the
// backoff with the attempt counted and the error recorded; a panic is an
// error; past MaxAttempts the event stays undelivered with its last error.
func TestConsumerDeliversAndRetries(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var mu sync.Mutex
	got := map[int64][]int{} // attempts seen per event
	keys := map[string]bool{}
	runConsumer(t, pool, events.ConsumerConfig{
		// Woken by notifications; the poll only catches those sent before
		// its listener was up (a loaded CI machine took over 100ms).
		PollInterval: time.Second,
		MaxAttempts:  3,
		Backoff:      func(int) time.Duration { return 20 * time.Millisecond },
		Handler: func(_ context.Context, _ pgx.Tx, e events.Event) error {
			mu.Lock()
			defer mu.Unlock()
			got[e.ID] = append(got[e.ID], e.Attempts)
			keys[e.Key] = true
			switch {
			case e.Key == "k001" && e.Attempts < 2:
				return errors.New("smtp: try later")
			case e.Key == "k002" && e.Attempts == 0:
				panic("boom")
			case e.Key == "k003":
				return errors.New("always \x00 failing \xff")
			}
			return nil
		},
	})
	time.Sleep(100 * time.Millisecond) // the listener's probe
	emit(t, pool, "c", 20)
	require.Eventually(t, func() bool {
		for _, e := range listEvents(t, pool, "c") {
			if e.Key == "k003" && e.Attempts < 3 || e.Key != "k003" && e.DeliveredAt.IsZero() {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	evs := listEvents(t, pool, "c")
	require.Len(t, evs, 20)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, keys, 20)
	for _, e := range evs {
		switch e.Key {
		case "k001":
			require.Equal(t, []int{0, 1, 2}, got[e.ID])
			require.Equal(t, 3, e.Attempts)
			require.Equal(t, "smtp: try later", e.LastError)
		case "k002":
			require.Equal(t, []int{0, 1}, got[e.ID])
			require.Contains(t, e.LastError, "panicked: boom")
		case "k003":
			require.Equal(t, []int{0, 1, 2}, got[e.ID], "given up after MaxAttempts")
			require.True(t, e.DeliveredAt.IsZero())
			require.Equal(t, "always  failing ?", e.LastError)
		default:
			require.Equal(t, []int{0}, got[e.ID], "event %d of %s", e.ID, e.Key)
			require.Equal(t, 1, e.Attempts)
			require.False(t, e.DeliveredAt.IsZero())
		}
	}
}

// What the handler writes with its transaction commits with the delivery,
// and is rolled back with a failed attempt.
func TestConsumerHandlerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE alert_emails (event_id bigint PRIMARY KEY, customer text NOT NULL)`)
	require.NoError(t, err)
	emit(t, pool, "h", 5)
	c, err := events.NewConsumer(pool, events.ConsumerConfig{DisableListen: true,
		Backoff: func(int) time.Duration { return 0 },
		Handler: func(ctx context.Context, tx pgx.Tx, e events.Event) error {
			if _, err := tx.Exec(ctx, `INSERT INTO alert_emails VALUES ($1, $2)`, e.ID, e.Key); err != nil {
				return err
			}
			if e.Key == "k000" && e.Attempts == 0 {
				return errors.New("after the insert")
			}
			return nil
		}})
	require.NoError(t, err)
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM alert_emails`).Scan(&rows))
	require.Equal(t, 4, rows, "the failed attempt's row is rolled back")
	n, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM alert_emails`).Scan(&rows))
	require.Equal(t, 5, rows)
	n, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A consumer killed mid-delivery (its context cancelled, or its backend
// terminated, while the handler blocks) leaves the event undelivered; another
// consumer delivers it.
func TestConsumerKilledMidDelivery(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"context", "terminate"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			s := testdb.NewSchema(t)
			cfg := s.Config.Copy()
			app := "consumer-" + randomHex()
			cfg.ConnConfig.RuntimeParams["application_name"] = app
			pool := s.PoolWithConfig(t, cfg)
			admin := s.Pool(t, 2)
			emit(t, pool, "x", 1)
			blocked := make(chan struct{})
			var once sync.Once
			stop := runConsumer(t, pool, events.ConsumerConfig{DisableListen: true, PollInterval: 10 * time.Millisecond,
				Handler: func(ctx context.Context, _ pgx.Tx, _ events.Event) error {
					once.Do(func() { close(blocked) })
					<-ctx.Done() // blocks until the consumer is stopped (or HandlerTimeout)
					return ctx.Err()
				}})
			<-blocked
			if how == "terminate" {
				_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND backend_type = 'client backend'`, app)
				require.NoError(t, err)
				time.Sleep(50 * time.Millisecond)
			}
			stop()
			evs := listEvents(t, admin, "x")
			require.Len(t, evs, 1)
			require.True(t, evs[0].DeliveredAt.IsZero())
			require.Zero(t, evs[0].Attempts, "a killed delivery counts no attempt")
			var delivered sync.WaitGroup
			delivered.Add(1)
			runConsumer(t, admin, events.ConsumerConfig{DisableListen: true, PollInterval: 10 * time.Millisecond,
				Handler: func(context.Context, pgx.Tx, events.Event) error { delivered.Done(); return nil }})
			delivered.Wait()
			waitDelivered(t, admin, "x", 5*time.Second)
		})
	}
}

// Consumers share the work and never deliver one event at the same time:
// every delivery of an event (its attempts, and a redelivery after a
// failure) is recorded with its start and end, and no two overlap.
func TestConsumersNeverOverlap(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	type span struct {
		consumer   int
		start, end time.Time
	}
	var mu sync.Mutex
	spans := map[int64][]span{}
	for i := range 3 {
		runConsumer(t, pool, events.ConsumerConfig{BatchSize: 3, PollInterval: 5 * time.Millisecond,
			Backoff: func(int) time.Duration { return 0 },
			Handler: func(_ context.Context, _ pgx.Tx, e events.Event) error {
				start := time.Now()
				time.Sleep(time.Duration(e.ID%3) * time.Millisecond)
				mu.Lock()
				spans[e.ID] = append(spans[e.ID], span{i, start, time.Now()})
				mu.Unlock()
				if e.ID%4 == 0 && e.Attempts == 0 {
					return errors.New("once more")
				}
				return nil
			}})
	}
	emit(t, pool, "o", 60)
	waitDelivered(t, pool, "o", 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, spans, 60)
	by := map[int]int{}
	for id, ss := range spans {
		want := 1
		if id%4 == 0 {
			want = 2
		}
		require.Len(t, ss, want, "event %d", id)
		slices.SortFunc(ss, func(a, b span) int { return a.start.Compare(b.start) })
		for i := 1; i < len(ss); i++ {
			require.False(t, ss[i].start.Before(ss[i-1].end), "event %d: deliveries overlap: %v", id, ss)
		}
		for _, s := range ss {
			by[s.consumer]++
		}
	}
	t.Logf("deliveries by consumer: %v", by)
}

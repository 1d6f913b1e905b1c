package integration

// The money walk with usage alerts: alerts join the walk of every money
// operation (charges, debits, refunds, settlements, grants, resets,
// AllowAll, plan changes, clock moves across periods, cleanup), which
// still checks every result against the account model, and the events are
// audited.

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
	"github.com/stretchr/testify/require"
)

// walkAlerts are the lines drawn on every plan of the walk.
var walkAlerts = pgratelimit.Alerts{UsedFractions: []float64{0.5, 0.9, 1}, BalanceAtOrBelow: []int64{50, 0}, Exhausted: true}

// alertWalk walks half the usual steps with the walk's plans given lines,
// under faults (nil: none), then audits the walk and its events.
func alertWalk(t *testing.T, pool *pgxpool.Pool, faults func() (context.Context, context.CancelFunc), settle func()) {
	seed := walkSeed(t)
	w := newWalker(t, pool, seed)
	w.faults = faults
	for i, l := range w.plans {
		cfg := l.Config()
		cfg.Alerts = walkAlerts
		a, err := newLimiterOn(pool, cfg)
		require.NoError(t, err)
		w.plans[i] = a
	}
	steps := max(walkSteps()/2, 1)
	for range steps {
		w.step(pool)
		if t.Failed() {
			return
		}
	}
	if settle != nil {
		settle() // the faults' terminations still under way
	}
	w.audit(pool)
	n := auditWalkEvents(t, pool, w)
	t.Logf("seed %d: %d steps, %d retries, %d events, %v", seed, steps, w.retries, n, w.stats)
}

// auditWalkEvents checks the walk's events: at most one per line, key and
// period; each within its period; each event of a line crossed written with
// a committed operation of its key, whose ledger row has the event's time
// and balance. It returns the number of events.
func auditWalkEvents(t *testing.T, pool *pgxpool.Pool, w *walker) int {
	ctx := context.Background()
	evs, err := events.List(ctx, pool, events.Filter{Prefix: "walk", Limit: 10000})
	require.NoError(t, err)
	seen := map[string]events.Event{}
	for _, e := range evs {
		id := fmt.Sprintf("%s %s %v %v %s", e.Key, e.Kind, e.Fraction, e.Level, e.PeriodStart.UTC())
		if o, ok := seen[id]; ok {
			t.Fatalf("line fired twice in a period: %+v and %+v", o, e)
		}
		seen[id] = e
		require.False(t, e.At.Before(e.PeriodStart), "%+v", e)
		require.True(t, e.At.Before(e.PeriodEnd), "%+v", e)
		if e.Kind == events.Exhausted {
			continue
		}
		es, err := w.plans[0].Ledger(ctx, e.Key, e.At)
		require.NoError(t, err)
		found := false
		for _, le := range es {
			found = found || le.At.Equal(e.At) && le.Balance == e.Balance
		}
		require.True(t, found, "no committed operation at %s with the balance of %+v", e.At, e)
	}
	return len(evs)
}

// TestMoneyWalkWithAlerts walks with alerts, without faults and with
// terminated backends.
func TestMoneyWalkWithAlerts(t *testing.T) {
	t.Parallel()
	t.Run("plain", func(t *testing.T) {
		t.Parallel()
		alertWalk(t, newPool(t), nil, nil)
	})
	t.Run("terminations", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSchema(t)
		cfg := s.Config.Copy()
		app := "awalk-" + randomHex()
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		pool := s.PoolWithConfig(t, cfg)
		admin := s.Pool(t, 2)
		rng := mrand.New(mrand.NewPCG(walkSeed(t), 11))
		var mu sync.Mutex
		var terminating sync.WaitGroup // the audit reads once every termination is done
		alertWalk(t, pool, func() (context.Context, context.CancelFunc) {
			mu.Lock()
			n, d := rng.IntN(2), time.Duration(rng.IntN(2000))*time.Microsecond
			mu.Unlock()
			if n == 0 {
				terminating.Go(func() {
					time.Sleep(d)
					_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`, app)
				})
			}
			return context.WithTimeout(context.Background(), 10*time.Second)
		}, func() {
			terminating.Wait()
			pool.Reset() // the audit reads on connections no termination reached
		})
	})
}

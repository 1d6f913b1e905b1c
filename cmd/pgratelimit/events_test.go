package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// alerting is a limiter with alerts at 80% of a bucket of 10 used, at a
// balance of 5 or less and when exhausted, refilled every hour.
func alerting(t *testing.T, pool *pgxpool.Pool, prefix string) *pgratelimit.Limiter {
	t.Helper()
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: prefix, Capacity: 10, Refill: 10, Interval: time.Hour,
		Alerts: pgratelimit.Alerts{UsedFractions: []float64{0.8}, BalanceAtOrBelow: []int64{5}, Exhausted: true}})
	require.NoError(t, err)
	return l
}

// charge charges key cost, allowed or not as want says.
func charge(ctx context.Context, t *testing.T, l *pgratelimit.Limiter, key string, cost int64, want bool) {
	t.Helper()
	r, err := l.AllowN(ctx, key, cost)
	require.NoError(t, err)
	require.Equal(t, want, r.Allowed)
}

// events lists the events: a charge that crosses 80% (and a balance of 5)
// writes two, a denial a third; each line says what the event is, pending
// until a consumer delivers it; --prefix, --key, --since and --limit
// select; --json prints a line of JSON per event.
func TestEvents(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	url, ctx := s.URL(t), context.Background()
	pool := s.Pool(t, 2)
	l := alerting(t, pool, "alerts")

	code, out, stderr := pgrl(url, "events")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "no events (limiters with Config.Alerts write them)\n", out)

	charge(ctx, t, l, "k1", 7, true) // 70% used, a balance of 3: below 5 only
	charge(pgratelimit.WithRequestID(ctx, "call-2"), t, l, "k1", 1, true)
	charge(ctx, t, l, "k1", 5, false)
	charge(ctx, t, l, "k2", 9, true)

	code, out, stderr = pgrl(url, "events", "--prefix", "alerts", "--key", "k1")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	period := `period (\S+)Z/(\S+)Z`
	require.Regexp(t, `^\d+  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  alerts "k1"  below 5  balance 3 \(3/10\)  `+period+`  pending$`, lines[0])
	require.Regexp(t, `^\d+  \S+  alerts "k1"  used 80%  balance 2 \(2/10\)  `+period+`  request "call-2"  pending$`, lines[1])
	require.Regexp(t, `^\d+  \S+  alerts "k1"  exhausted -  balance 2 \(2/10\)  `+period+`  pending$`, lines[2])
	m := regexp.MustCompile(period).FindStringSubmatch(lines[0])
	start, err := time.Parse(time.RFC3339, m[1]+"Z")
	require.NoError(t, err)
	end, err := time.Parse(time.RFC3339, m[2]+"Z")
	require.NoError(t, err)
	require.Equal(t, time.Hour, end.Sub(start), "the time an empty bucket takes to fill")

	// A consumer delivers them; the newest three of all, as JSON.
	deliver(t, pool)
	code, out, stderr = pgrl(url, "events", "--limit", "3", "--json")
	require.Equal(t, 0, code, stderr)
	var evs []eventJSON
	for line := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		var e eventJSON
		require.NoError(t, json.Unmarshal([]byte(line), &e), line)
		evs = append(evs, e)
	}
	require.Len(t, evs, 3, out)
	require.Equal(t, "exhausted", evs[0].Kind)
	require.Nil(t, evs[0].Fraction)
	require.Nil(t, evs[0].Level)
	require.Equal(t, "k2", evs[1].Key)
	require.Equal(t, "used", evs[1].Kind)
	require.Equal(t, 0.8, *evs[1].Fraction)
	require.Nil(t, evs[1].Level)
	require.Equal(t, int64(1), evs[1].Balance)
	require.NotNil(t, evs[1].DeliveredAt)
	require.Equal(t, 1, evs[1].Attempts)
	require.Equal(t, "below", evs[2].Kind)
	require.Equal(t, int64(5), *evs[2].Level)
	require.Less(t, evs[0].ID, evs[1].ID, "newest last")
	require.Less(t, evs[1].ID, evs[2].ID, "newest last")

	code, out, _ = pgrl(url, "events", "--key", "k2")
	require.Equal(t, 0, code)
	require.Regexp(t, `^\d+  \S+  alerts "k2"  used 80%  balance 1 \(1/10\)  `+period+`  delivered \d{4}-\S+Z\n\d+  .* below 5 .*delivered`, out)
	code, out, _ = pgrl(url, "events", "--since", "1h", "--prefix", "other")
	require.Equal(t, 0, code)
	require.Regexp(t, `^no events for prefix "other" since \S+ \(limiters with Config.Alerts write them\)\n$`, out)
	code, out, _ = pgrl(url, "events", "--since", "2999-01-01")
	require.Equal(t, 0, code)
	require.Equal(t, "no events since 2999-01-01T00:00:00Z (limiters with Config.Alerts write them)\n", out)

	code, _, stderr = pgrl(testdb.NewEmptySchema(t).URL(t), "events", "--follow")
	require.Equal(t, 2, code)
	require.True(t, strings.HasPrefix(stderr, "pgratelimit events: the pgratelimit tables are not in this database"), stderr)
}

// deliver delivers every event due with a consumer's RunOnce.
func deliver(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	c, err := events.NewConsumer(pool, events.ConsumerConfig{
		Handler: func(context.Context, pgx.Tx, events.Event) error { return nil },
	})
	require.NoError(t, err)
	_, err = c.RunOnce(context.Background())
	require.NoError(t, err)
}

// events --follow prints the events there are, then each new one as it
// is written (once, though it reads the last IDs again), until cancelled:
// exit status 0.
func TestEventsFollow(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	url, ctx := s.URL(t), context.Background()
	pool := s.Pool(t, 2)
	l := alerting(t, pool, "follow")
	other := alerting(t, pool, "not-followed")
	charge(ctx, t, l, "k1", 8, true) // used 80%, a balance of 2

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out, stderr lockedBuffer
	getenv := databaseURL(url)
	done := make(chan int, 1)
	go func() { done <- run(fctx, []string{"events", "--follow", "--prefix", "follow"}, &out, &stderr, getenv) }()
	lines := func(n int) []string {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Count(out.String(), "\n") >= n }, 10*time.Second, 10*time.Millisecond,
			"%d lines; stdout:\n%s\nstderr:\n%s", n, out.String(), stderr.String())
		return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	}
	got := lines(2)
	require.Regexp(t, `^\d+  \S+  follow "k1"  used 80%  `, got[0])
	require.Regexp(t, `^\d+  \S+  follow "k1"  below 5  `, got[1])

	charge(ctx, t, other, "k1", 8, true) // another prefix: not printed
	charge(ctx, t, l, "k2", 3, true)     // nothing crossed
	charge(ctx, t, l, "k2", 6, true)     // used 90%, a balance of 1
	got = lines(4)
	require.Regexp(t, `^\d+  \S+  follow "k2"  used 80%  balance 1 `, got[2])
	require.Regexp(t, `^\d+  \S+  follow "k2"  below 5  balance 1 `, got[3])
	time.Sleep(3 * eventPollInterval) // polls that read them again print nothing
	require.Len(t, lines(4), 4, out.String())

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("events --follow did not stop when cancelled")
	}
	require.Empty(t, stderr.String())
}

// The follow loop's printer skips what it printed, reads again the last
// IDs (a transaction may commit after a later one), and does not print
// what the first listing left out with --limit.
func TestEventPrinter(t *testing.T) {
	var out lockedBuffer
	f := newFlags(&cli{stdout: &out}, "events")
	p := &eventPrinter{f: f, seen: map[int64]bool{}, floor: 40}
	ev := func(ids ...int64) []events.Event {
		var evs []events.Event
		for _, id := range ids {
			evs = append(evs, events.Event{ID: id, Kind: events.Exhausted, Prefix: "p", Key: "k"})
		}
		return evs
	}
	printed := func() []string {
		var ids []string
		for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			id, _, _ := strings.Cut(line, " ")
			ids = append(ids, id)
		}
		out.b.Reset()
		return ids
	}
	p.print(ev(40, 41, 43))
	require.Equal(t, []string{"40", "41", "43"}, printed())
	p.print(ev(3, 39, 40, 41, 42, 43, 44)) // 42 committed late
	require.Equal(t, []string{"42", "44"}, printed())
	p.print(ev(200))
	require.Equal(t, []string{"200"}, printed())
	require.Equal(t, map[int64]bool{200: true}, p.seen, "IDs beyond the window are forgotten")
	p.print(ev(99, 100, 101, 200))
	require.Equal(t, []string{"101"}, printed(), "an ID followWindow below the last is not read again")
}

func TestEventLine(t *testing.T) {
	at := time.Date(2026, 11, 25, 9, 58, 3, 123456000, time.UTC)
	e := events.Event{ID: 17, Kind: events.Used, Prefix: "api-calls", Key: "customer 1", Fraction: 0.57,
		Balance: 430, Remaining: 430, Capacity: 1000, At: at, RequestID: "call-1",
		PeriodStart: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), PeriodEnd: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	period := "period 2026-11-01T00:00:00Z/2026-12-01T00:00:00Z"
	require.Equal(t, `17  2026-11-25T09:58:03.123Z  api-calls "customer 1"  used 57%  balance 430 (430/1000)  `+period+`  request "call-1"  pending`, eventLine(e))
	e.Kind, e.Level, e.Balance, e.RequestID, e.Attempts, e.LastError = events.Below, 100, 1100, "", 2, "smtp: timeout"
	require.Equal(t, `17  2026-11-25T09:58:03.123Z  api-calls "customer 1"  below 100  balance 1100 (430/1000)  `+period+`  pending (2 attempts, last error "smtp: timeout")`, eventLine(e))
	e.Kind, e.Attempts, e.DeliveredAt = events.Exhausted, 3, at.Add(time.Second).In(time.FixedZone("X", 3600))
	require.Equal(t, `17  2026-11-25T09:58:03.123Z  api-calls "customer 1"  exhausted -  balance 1100 (430/1000)  `+period+`  delivered 2026-11-25T09:58:04.123Z`, eventLine(e))
}

package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// syncBuffer is a bytes.Buffer that the demo writes while a test reads it.
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

var pageLine = regexp.MustCompile(`(?m)^The page: +(http://\S+/) `)

func TestMain(m *testing.M) { testdb.Main(m) }

// startDemo runs the demo (what `pgratelimit demo` and make demo run) in
// process against dbURL, its jobs as jc says, and returns the page's URL
// once the walkthrough is done; the demo stops when the test ends.
func startDemo(t *testing.T, dbURL string, jc jobsConfig) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Addr: "127.0.0.1:0", DatabaseURL: dbURL, Timeout: 10 * time.Second, Stdout: &stdout, Stderr: &stderr, jobs: jc})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, stderr.String())
		case <-time.After(30 * time.Second):
			t.Error("the demo did not stop")
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := pageLine.FindStringSubmatch(stdout.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-done:
			t.Fatalf("the demo returned (%v) before serving the page:\n%s\n%s", err, stdout.String(), stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no page URL in the demo's output:\n%s", stdout.String())
		}
	}
}

func getJSON(t *testing.T, method, u string, form url.Values, v any) int {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if v != nil {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}
	return resp.StatusCode
}

// The page's API without a browser: the state comes from the database, a
// policy applies (or is refused in its own words), the rollback scenario
// spends nothing, two limits answer together, credits spill from the
// monthly quota into a grant, firing usage alerts that the demo's consumer
// delivers, and jobs hold leases (with a TTL of 4s, not the page's 10s).
func TestDemoAPI(t *testing.T) {
	t.Parallel()
	schema := testdb.NewEmptySchema(t)
	dbURL, db := schema.URL(t), schema.Pool(t, 1)
	page := startDemo(t, dbURL, jobsConfig{ttl: 4 * time.Second, runFor: 6 * time.Second})

	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, "ip:127.0.0.1", st.Key)
	require.Equal(t, int64(5), st.Bucket.Capacity)
	require.Equal(t, `"demo";q=5;w=5`, st.Policy.Header)
	require.Empty(t, st.Error)
	var errBody map[string]string

	// A cost below 1 or above the capacity is the client's bad input: 400
	// with the library's words, not the limiter failing.
	for _, c := range []string{"0", "-1", "6"} {
		resp, err := http.Get(page + "api/limited?cost=" + c)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, c)
		require.Regexp(t, `^400 bad request: pgratelimit: (invalid cost: -?\d+ is below 1|cost exceeds capacity: cost 6, capacity 5)\n$`, string(body), c)
	}
	require.Equal(t, 400, getJSON(t, "POST", page+"api/credits/charge?cost=0", nil, &errBody))
	require.Equal(t, `cost must be a whole number of at least 1, got "0"`, errBody["error"])
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, creditsJSON{Prefix: "demo-credits", Period: "on the 1st of each month (UTC)", Quota: 100, Capacity: 100}, st.Credits)

	require.Equal(t, 400, getJSON(t, "POST", page+"api/policy", url.Values{"capacity": {"3"}, "refill": {"1"}, "interval": {"soon"}}, &errBody))
	require.Contains(t, errBody["error"], `Interval must be a positive duration such as 1s, 500ms or 1m, got "soon"`)
	require.Equal(t, 400, getJSON(t, "POST", page+"api/policy", url.Values{"capacity": {"3"}, "refill": {"1"}, "interval": {"1ns"}}, &errBody))
	require.Equal(t, "invalid config: Config.Interval must be a whole number of microseconds, got 1ns", errBody["error"])

	var p policyJSON
	require.Equal(t, 200, getJSON(t, "POST", page+"api/policy", url.Values{"capacity": {"4"}, "refill": {"2"}, "interval": {"1h"}, "storage": {"durable"}}, &p))
	require.Equal(t, policyJSON{Gen: 1, Prefix: "demo", Capacity: 4, Refill: 2, Interval: "1h0m0s", IntervalMS: 3600000,
		Storage: "durable", Header: `"demo";q=4;w=7200`, Minute: "8 per minute"}, p)
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, bucketJSON{Tokens: 4, Capacity: 4}, st.Bucket, "a fresh bucket")

	var rb rollbackJSON
	require.Equal(t, 200, getJSON(t, "POST", page+"api/scenario/rollback?cost=3", nil, &rb))
	require.Equal(t, rollbackJSON{Cost: 3, Before: 4, Allowed: true, InTx: 1, Failure: "ERROR: division by zero (SQLSTATE 22012)", After: 4, Capacity: 4}, rb)

	// Two limits: 4 per 2h-refill and 8 per minute; the first limit denies
	// the fifth request and the per-minute bucket keeps what it had.
	statuses := ""
	for range 5 {
		resp, err := http.Get(page + "api/two-limits")
		require.NoError(t, err)
		resp.Body.Close()
		statuses += fmt.Sprint(resp.StatusCode, " ")
		require.Equal(t, `"demo";q=4;w=7200, "demo-per-minute";q=8;w=60`, resp.Header.Get("RateLimit-Policy"))
		if resp.StatusCode == 429 {
			require.Regexp(t, `^"demo";r=0;t=(3[6-9]\d\d|[4-6]\d\d\d|7[01]\d\d|7200)$`, resp.Header.Get("RateLimit"), "two refills on the hours' grid: 1-2 hours")
		}
	}
	require.Equal(t, "200 200 200 200 429 ", statuses)
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, int64(0), st.Bucket.Tokens)
	require.Equal(t, int64(4), st.Minute.Tokens, "the denied request took nothing from the per-minute limit")

	checkCreditsAPI(t, page, db)
	checkCreditsAPIMore(t, page, db)
	checkJobsAPI(t, page, db)

	// The event stream sends the state every half second.
	resp, err := http.Get(page + "api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	buf := make([]byte, 0, 1<<14)
	start := time.Now()
	for strings.Count(string(buf), "data: ") < 3 {
		n, err := resp.Body.Read(buf[len(buf):cap(buf)])
		require.NoError(t, err)
		buf = buf[:len(buf)+n]
	}
	// At 0, 0.5 and 1s: the bound is generous, for a busy machine; a stream
	// that sent only on changes would send one.
	require.Less(t, time.Since(start), 10*time.Second, "three events in a few seconds")
}

// chargeCredits charges the credits scenario cost through the demo's API
// and returns the answer.
func chargeCredits(t *testing.T, page, cost string) (int, http.Header, chargeJSON) {
	t.Helper()
	resp, err := http.Post(page+"api/credits/charge?cost="+cost, "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var c chargeJSON
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	return resp.StatusCode, resp.Header, c
}

// grantedJSON is the answer to a grant or a reset of the credits: what it
// did (the card's state is the state's).
type grantedJSON struct {
	Message string `json:"message"`
}

// checkCreditsAPI: charges of 7 use the monthly quota of 100 up to 2, the
// 15th is denied with the reason; a grant of 10; a charge of 4 takes the
// quota's 2 and 2 of the grant; the alerts they fire are delivered.
func checkCreditsAPI(t *testing.T, page string, db *pgxpool.Pool) {
	charge := func(cost string) (int, http.Header, chargeJSON) { return chargeCredits(t, page, cost) }
	for i := range 14 {
		code, h, c := charge("7")
		require.Equal(t, 200, code)
		require.Equal(t, chargeJSON{Allowed: true, Cost: 7, FromQuota: 7, Quota: int64(93 - 7*i), Capacity: 100,
			Message: fmt.Sprintf("Charged 7 from the monthly quota: %d of 100 left, 0 granted.", 93-7*i)}, c)
		require.Regexp(t, `^"demo-credits";q=100;w=\d+$`, h.Get("RateLimit-Policy"))
	}
	code, h, c := charge("7")
	require.Equal(t, 429, code)
	c.Message = renews(c.Message)
	require.Equal(t, chargeJSON{Cost: 7, Quota: 2, Capacity: 100, Message: "Denied: a charge of 7 is more than the 2 left of the monthly quota " +
		"and the 0 granted; nothing taken. The quota renews in T; or grant credits."}, c)
	retry, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	require.NoError(t, err)
	require.InDelta(t, nextMonth(), retry, 2, "on the 1st")
	require.Equal(t, `"demo-credits";r=2;t=`+h.Get("Retry-After"), h.Get("RateLimit"))

	var granted grantedJSON
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"10"}}, &granted))
	require.Equal(t, "Granted 10 credits (never expires): 10 granted in all, beside the quota's 2 of 100.", granted.Message)

	code, _, c = charge("4")
	require.Equal(t, 200, code)
	require.Equal(t, chargeJSON{Allowed: true, Cost: 4, FromQuota: 2, FromGrants: 2, Quota: 0, Capacity: 100, Granted: 8,
		Message: "Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left)."}, c)
	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, int64(0), st.Credits.Quota)
	require.Equal(t, int64(8), st.Credits.Granted)
	require.InDelta(t, time.Until(firstOfNextMonth()).Milliseconds(), st.Credits.RenewsInMS, float64(time.Minute.Milliseconds()))
	require.Equal(t, alertsOfAll, deliveredAlerts(t, db), "each once, delivered by the demo's consumer")
}

// checkCreditsAPIMore: charges beyond the quota and grants, bad input, a
// grant that expires, and starting over, which re-arms the alerts.
func checkCreditsAPIMore(t *testing.T, page string, db *pgxpool.Pool) {
	charge := func(cost string) (int, http.Header, chargeJSON) { return chargeCredits(t, page, cost) }
	// Beyond the quota and the grant: denied, nothing taken; beyond even a
	// full quota: grant credits.
	code, _, c := charge("20")
	require.Equal(t, 429, code)
	c.Message = renews(c.Message)
	require.Equal(t, chargeJSON{Cost: 20, Quota: 0, Capacity: 100, Granted: 8, Message: "Denied: a charge of 20 is more than the 0 left of the " +
		"monthly quota and the 8 granted; nothing taken. The quota renews in T; or grant credits."}, c)
	code, _, c = charge("200")
	require.Equal(t, 429, code)
	require.Contains(t, c.Message, "Even a full quota (100) would not cover it: grant credits.")
	code, _, _ = charge("x")
	require.Equal(t, 400, code)
	var errBody map[string]string
	require.Equal(t, 400, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"10"}, "expires_in": {"later"}}, &errBody))
	require.Equal(t, `expires_in must be a positive duration such as 1h or 168h, got "later"`, errBody["error"])

	// A grant that expires is spent first; starting over empties both.
	var granted grantedJSON
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"5"}, "expires_in": {"90m"}}, &granted))
	require.Equal(t, "Granted 5 credits (expires in 1h 30m): 13 granted in all, beside the quota's 0 of 100.", granted.Message)
	l, err := pgratelimit.New(db, creditsPolicy())
	require.NoError(t, err)
	grants, err := l.Grants(context.Background(), "ip:127.0.0.1")
	require.NoError(t, err)
	require.Len(t, grants, 2)
	require.Equal(t, int64(5), grants[0].Amount, "the one that expires first")
	require.InDelta(t, time.Until(grants[0].ExpiresAt).Minutes(), 90, 1)
	require.Equal(t, int64(8), grants[1].Amount)
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/reset", nil, &granted))
	require.Equal(t, "Started over: a full quota of 100, no grants.", granted.Message)
	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, creditsJSON{Prefix: "demo-credits", Period: "on the 1st of each month (UTC)", Quota: 100, Capacity: 100}, st.Credits)
	require.Empty(t, deliveredAlerts(t, db), "starting over deletes the alerts")
	// Starting over re-arms the alerts: a charge past half the quota fires
	// its alert again.
	code, _, _ = charge("60")
	require.Equal(t, 200, code)
	require.Equal(t, []string{"used 50%, balance 40"}, deliveredAlerts(t, db))
}

// The usage alerts of the credits key, as deliveredAlerts says them: those
// of the quota used up (charges of 7: 50% used on the 8th, 80% and a
// balance of 20 or less on the 12th, the 15th denied), then all of them (a
// charge that takes the quota's last credits).
var (
	alertsOfUsedUp = []string{"used 50%, balance 44", "used 80%, balance 16", "below 20, balance 16", "exhausted, balance 2"}
	alertsOfAll    = append(alertsOfUsedUp[:len(alertsOfUsedUp):len(alertsOfUsedUp)], "used 100%, balance 8")
)

// deliveredAlerts waits until the demo's consumer has delivered the
// credits key's alerts (the events the operator UI's key page lists), and
// returns them as kind, line and balance, oldest first.
func deliveredAlerts(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	var evs []events.Event
	delivered := func() bool {
		var err error
		evs, err = events.List(context.Background(), db, events.Filter{Prefix: creditsPrefix, Key: "ip:127.0.0.1"})
		require.NoError(t, err)
		return !slices.ContainsFunc(evs, func(e events.Event) bool { return e.DeliveredAt.IsZero() })
	}
	for deadline := time.Now().Add(10 * time.Second); !delivered(); time.Sleep(20 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "alerts not delivered: %+v", evs)
	}
	var out []string
	for _, e := range evs {
		line := string(e.Kind)
		switch e.Kind {
		case events.Used:
			line += " " + human.Percent(e.Fraction)
		case events.Below:
			line += " " + strconv.FormatInt(e.Level, 10)
		}
		out = append(out, fmt.Sprintf("%s, balance %d", line, e.Balance))
	}
	return out
}

// dbNow is the database's clock, on which the buckets' refills fall.
func dbNow(t *testing.T, db *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// afterRefill waits for the next refill of a bucket that refills every
// interval, on the grid of the database's clock, and returns its moment.
func afterRefill(t *testing.T, db *pgxpool.Pool, interval time.Duration) time.Time {
	t.Helper()
	now := dbNow(t, db)
	next := now.Truncate(interval).Add(interval)
	time.Sleep(next.Sub(now) + 20*time.Millisecond)
	return next
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// renews replaces the time in "The quota renews in ...;" by T: the monthly
// quota renews on the 1st, however far away that is when the test runs.
func renews(msg string) string {
	return regexp.MustCompile(`renews in [^;]+;`).ReplaceAllString(msg, "renews in T;")
}

// firstOfNextMonth is when the demo's monthly quota renews.
func firstOfNextMonth() time.Time {
	now := time.Now().UTC()
	return time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
}

// nextMonth is the whole seconds until then, rounded up, as headers say it.
func nextMonth() int64 {
	d := time.Until(firstOfNextMonth())
	return int64((d + time.Second - 1) / time.Second)
}

package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/humantime"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
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
// process against dbURL, and returns the page's URL once the walkthrough is
// done; the demo stops when the test ends.
func startDemo(t *testing.T, dbURL string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Addr: "127.0.0.1:0", DatabaseURL: dbURL, Timeout: 10 * time.Second, Stdout: &stdout, Stderr: &stderr})
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
// spends nothing, two limits answer together, and credits spill from the
// monthly quota into a grant.
func TestDemoAPI(t *testing.T) {
	t.Parallel()
	page := startDemo(t, testdb.NewEmptySchema(t).URL(t))

	var st stateJSON
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, "ip:127.0.0.1", st.Key)
	require.Equal(t, int64(5), st.Bucket.Capacity)
	require.Equal(t, `"demo";q=5;w=5`, st.Policy.Header)
	require.Equal(t, checkCounts{Allowed: 5, Denied: 2}, st.Checks, "the walkthrough's seven checks, read from pgratelimit.checks")
	require.Empty(t, st.Error)
	require.Equal(t, creditsJSON{Prefix: "demo-credits", Period: "on the 1st of each month (UTC)", Quota: 100, Capacity: 100, Grants: []creditGrantJSON{}}, st.Credits)

	var errBody map[string]string
	require.Equal(t, 400, getJSON(t, "POST", page+"api/policy", url.Values{"capacity": {"3"}, "refill": {"1"}, "interval": {"soon"}}, &errBody))
	require.Contains(t, errBody["error"], `Interval must be a positive duration such as 1s, 500ms or 1m, got "soon"`)
	require.Equal(t, 400, getJSON(t, "POST", page+"api/policy", url.Values{"capacity": {"3"}, "refill": {"1"}, "interval": {"1ns"}}, &errBody))
	require.Equal(t, "invalid config: Interval must be a whole number of microseconds, got 1ns", errBody["error"])

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

	// Credits: charges of 7 use the monthly quota of 100 up to 2, the 15th
	// is denied with the reason; a grant of 10; a charge of 4 takes the
	// quota's 2 and 2 of the grant.
	charge := func(cost string) (int, http.Header, chargeJSON) {
		t.Helper()
		resp, err := http.Post(page+"api/credits/charge?cost="+cost, "", nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		var c chargeJSON
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
		return resp.StatusCode, resp.Header, c
	}
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

	var granted struct {
		Message string      `json:"message"`
		Credits creditsJSON `json:"credits"`
	}
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"10"}}, &granted))
	require.Equal(t, "Granted 10 credits (never expires): 10 granted in all, beside the quota's 2 of 100.", granted.Message)
	require.Equal(t, []creditGrantJSON{{Amount: 10}}, granted.Credits.Grants)

	code, _, c = charge("4")
	require.Equal(t, 200, code)
	require.Equal(t, chargeJSON{Allowed: true, Cost: 4, FromQuota: 2, FromGrants: 2, Quota: 0, Capacity: 100, Granted: 8,
		Message: "Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left)."}, c)
	require.Equal(t, 200, getJSON(t, "GET", page+"api/state", nil, &st))
	require.Equal(t, int64(0), st.Credits.Quota)
	require.Equal(t, int64(8), st.Credits.Granted)
	require.Equal(t, []creditGrantJSON{{Amount: 8}}, st.Credits.Grants)
	require.InDelta(t, time.Until(firstOfNextMonth()).Milliseconds(), st.Credits.RenewsInMS, float64(time.Minute.Milliseconds()))

	// Beyond the quota and the grant: denied, nothing taken; beyond even a
	// full quota: grant credits.
	code, _, c = charge("20")
	require.Equal(t, 429, code)
	c.Message = renews(c.Message)
	require.Equal(t, chargeJSON{Cost: 20, Quota: 0, Capacity: 100, Granted: 8, Message: "Denied: a charge of 20 is more than the 0 left of the " +
		"monthly quota and the 8 granted; nothing taken. The quota renews in T; or grant credits."}, c)
	code, _, c = charge("200")
	require.Equal(t, 429, code)
	require.Contains(t, c.Message, "Even a full quota (100) would not cover it: grant credits.")
	code, _, _ = charge("x")
	require.Equal(t, 400, code)
	require.Equal(t, 400, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"10"}, "expires_in": {"later"}}, &errBody))
	require.Equal(t, `expires_in must be a positive duration such as 1h or 168h, got "later"`, errBody["error"])

	// A grant that expires is spent first; starting over empties both.
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/grant", url.Values{"amount": {"5"}, "expires_in": {"90m"}}, &granted))
	require.Equal(t, "Granted 5 credits (expires in 1h 30m): 13 granted in all, beside the quota's 0 of 100.", granted.Message)
	require.Len(t, granted.Credits.Grants, 2)
	require.Equal(t, int64(5), granted.Credits.Grants[0].Amount)
	require.NotEmpty(t, granted.Credits.Grants[0].ExpiresAt)
	require.Equal(t, creditGrantJSON{Amount: 8}, granted.Credits.Grants[1])
	require.Equal(t, 200, getJSON(t, "POST", page+"api/credits/reset", nil, &granted))
	require.Equal(t, creditsJSON{Prefix: "demo-credits", Period: "on the 1st of each month (UTC)", Quota: 100, Capacity: 100, Grants: []creditGrantJSON{}}, granted.Credits)

	// The event stream sends the state at least twice a second.
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
	require.Less(t, time.Since(start), time.Second, "three events within a second")
}

// chromium is Debian's Chromium, which .ci/run installs.
const chromium = "/usr/bin/chromium"

// The page in a real browser: a burst shows 200s then 429s, the token count
// drops to 0 and refills, a new policy applies, the rollback scenario spends
// nothing, the credits gauges follow a monthly quota used up, a grant and a
// charge that spills into it, and the console stays free of errors. With
// PGRATELIMIT_UPDATE_SCREENSHOT=1 it saves docs/demo.png.
func TestDemoPage(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no Chromium at %s (apt-get install chromium): %v", chromium, err)
		}
		t.Skipf("no Chromium at %s (apt-get install chromium)", chromium)
	}
	t.Parallel()
	schema := testdb.NewEmptySchema(t)
	page := startDemo(t, schema.URL(t))
	db := schema.Pool(t, 1)

	// Generous timeouts: the test shares the machine with the rest of make
	// test (load averages of 5-8 on 2 cores), and they only bound failures.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	actx, cancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()

	// Every console message, checked at the end. The browser logs each 429
	// that fetch receives as a network error: those are the demo working, as
	// is the 400 of the policy the test gets refused on purpose.
	var mu sync.Mutex
	var consoleErrors []string
	console := chromedp.Console(bctx)
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type != chromedp.ConsoleError && !m.IsException() {
				continue
			}
			if m.Source == "network" && (strings.Contains(m.Text, "429 (Too Many Requests)") ||
				strings.Contains(m.Text, "400 (Bad Request)") && strings.HasSuffix(m.URL, "/api/policy")) {
				continue
			}
			mu.Lock()
			consoleErrors = append(consoleErrors, m.String()+" at "+m.URL)
			mu.Unlock()
		}
	}()

	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, actions...), what)
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, js)
		return s
	}
	// waitFor polls a JavaScript condition in the page.
	waitFor := func(what, cond string, timeout time.Duration) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](cond,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
		require.NoError(t, err, "waiting for %s (%s)", what, cond)
	}
	const q = `document.querySelector('[data-testid="%s"]')`
	text := func(id string) string { return eval(fmt.Sprintf(q+`.textContent`, id)) }
	results := func() []string {
		var out []string
		require.NoError(t, json.Unmarshal([]byte(eval(`JSON.stringify([...document.querySelectorAll('[data-testid="result"]')].map(e => e.textContent))`)), &out))
		return out
	}
	setValue := func(id, v string) chromedp.Action[chromedp.Void] {
		return chromedp.SetValue(fmt.Sprintf(`[data-testid="%s"]`, id), v)
	}
	// click waits until no scenario runs (they disable the buttons), then
	// clicks.
	click := func(id string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			idle := chromedp.Poll[chromedp.Void](fmt.Sprintf(`!`+q+`.disabled`, id),
				chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(time.Minute))
			if _, err := idle(ctx, tg); err != nil {
				return chromedp.Void{}, err
			}
			return chromedp.Click(fmt.Sprintf(`[data-testid="%s"]`, id))(ctx, tg)
		}
	}

	do("open the page", chromedp.Navigate(page))
	waitFor("the first state", fmt.Sprintf(`/^\d+$/.test(`+q+`.textContent)`, "remaining"), time.Minute)
	require.Equal(t, "ip:127.0.0.1", text("key"))

	// The page says waits as the CLI does (humantime), to the tenth of a
	// second below 10s where the CLI gives the millisecond.
	waits := []int64{10000, 19001, 20000, 59500, 60000, 724100, 3*3600000 + 12*60000, 3 * 3600000, 3*3600000 + 1000,
		86370000, (5*24 + 14) * 3600000, 134*3600000 + 48*60000 + 31000, 40 * 24 * 3600000}
	var said []string
	require.NoError(t, json.Unmarshal([]byte(eval(fmt.Sprintf(`JSON.stringify(%s.map(fmtMs))`, mustJSON(t, waits)))), &said))
	for i, ms := range waits {
		require.Equal(t, humantime.Duration(time.Duration(ms)*time.Millisecond), said[i], "fmtMs(%d)", ms)
	}
	require.Equal(t, `["0s","412ms","4.4s","9.9s","10s"]`, eval(`JSON.stringify([0, 412, 4306, 9900, 9950].map(fmtMs))`))

	// One request.
	do("send one", click("send"))
	waitFor("its response", `document.querySelectorAll('[data-testid="result"]').length === 1`, 30*time.Second)
	require.Regexp(t, `^#1 (200 OK|429 Too Many Requests) cost 1 RateLimit: "demo";r=\d;t=\d`, results()[0])

	// A policy whose refills are slow enough to watch the bucket at 0.
	do("a slow policy", setValue("capacity", "5"), setValue("refill", "1"), setValue("interval", "3s"), click("apply"))
	waitFor("the policy", fmt.Sprintf(q+`.textContent.includes('Refill 1 every 3s')`, "policy"), 30*time.Second)
	waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '5'`, "remaining"), 30*time.Second)

	// The burst: 200s, then 429s, all between two refills. Refills fall
	// every 3s on the database clock's grid; the burst starts just after one
	// and must end in the first 2s of it, so that the bucket shows 0 for a
	// while after; one that did not (a slow machine) is run again.
	var burst []string
	for attempt := 1; ; attempt++ {
		start := afterRefill(t, db, 3*time.Second)
		n := len(results())
		eval(fmt.Sprintf(`(`+q+`.textContent = "", "")`, "scenario-status")) // not the last attempt's
		do("the burst scenario", click("scenario-burst"))
		waitFor("the burst", fmt.Sprintf(q+`.textContent.startsWith('Burst of 8')`, "scenario-status"), time.Minute)
		if end := dbNow(t, db); end.Before(start.Add(2 * time.Second)) {
			burst = results()[n:]
			break
		} else if attempt == 5 {
			t.Fatalf("5 bursts of 8 requests each took more than 2s (the last %s): the machine is too slow for this test", end.Sub(start))
		} else {
			t.Logf("the burst ended %s after the refill, past the 2s it has: again", end.Sub(start))
		}
	}
	var statuses []string
	for _, r := range burst {
		statuses = append(statuses, regexp.MustCompile(`^#\d+ (\d{3}) `).FindStringSubmatch(r)[1])
	}
	require.Equal(t, []string{"200", "200", "200", "200", "200", "429", "429", "429"}, statuses, "%q", burst)
	require.Contains(t, burst[5], "Retry-After: ")
	require.Equal(t, "Burst of 8 from a full bucket of 5: 5 allowed (200), 3 denied (429).", text("scenario-status"))

	// The token count reaches 0, then refills on the grid.
	waitFor("an empty bucket", fmt.Sprintf(q+`.textContent === '0'`, "remaining"), 30*time.Second)
	waitFor("a refill", fmt.Sprintf(q+`.textContent === '1'`, "remaining"), 30*time.Second)

	// The counters come from pgratelimit.checks.
	waitFor("the counters", fmt.Sprintf(`Number(`+q+`.textContent) >= 3`, "count-denied"), 30*time.Second)

	// Another policy: a new limiter, a fresh bucket.
	do("a fast policy", setValue("capacity", "3"), setValue("refill", "2"), setValue("interval", "500ms"), setValue("storage", "durable"), click("apply"))
	waitFor("the policy", fmt.Sprintf(q+`.textContent.includes('Capacity 3, Refill 2 every 500ms, durable')`, "policy"), 30*time.Second)
	waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '3'`, "remaining"), 30*time.Second)

	// Steady traffic at 90% of the refill rate: every request allowed.
	do("the steady scenario", click("scenario-steady"))
	waitFor("steady", fmt.Sprintf(q+`.textContent.startsWith('Steady, at 90%% of the refill rate:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Steady, at 90% of the refill rate: 12 of 12 allowed.", text("scenario-status"))

	// A policy the limiter refuses says why, on the page.
	do("a bad interval", setValue("interval", "soon"), click("apply"))
	waitFor("the refusal", fmt.Sprintf(q+`.textContent.includes('Interval must be')`, "scenario-status"), 30*time.Second)
	require.Equal(t, `Interval must be a positive duration such as 1s, 500ms or 1m, got "soon"`, text("scenario-status"))
	require.Contains(t, text("policy"), "Capacity 3, Refill 2 every 500ms, durable", "the policy stays")

	// Credits charged in a transaction that rolls back: nothing spent.
	do("the rollback scenario", click("scenario-rollback"))
	waitFor("the rollback", fmt.Sprintf(q+`.textContent.startsWith('Rollback:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Rollback: charged 3 inside a transaction (3 → 0 tokens, seen inside it); then its work failed "+
		"(ERROR: division by zero (SQLSTATE 22012)) and it rolled back: the bucket has 3 of 3, nothing spent.", text("scenario-status"))

	// Two limits at once.
	do("the two-limits scenario", click("scenario-two-limits"))
	waitFor("two limits", fmt.Sprintf(q+`.textContent.includes('Requests denied by one limit took nothing from the other')`, "scenario-status"), 30*time.Second)
	require.Regexp(t, `^Two limits: [1-6] of 9 allowed; denied: `, text("scenario-status"))
	require.Regexp(t, `^[0-5] of 6$`, text("minute"))

	// Credits, step by step: the monthly quota used up (a 429 that says
	// why), a grant, and a charge that spills from the quota into it.
	credits := func(quota, granted, grants string) {
		t.Helper()
		waitFor("quota "+quota+", granted "+granted, fmt.Sprintf(q+`.textContent === '%s' && `+q+`.textContent === '%s' && `+q+`.textContent === '%s'`,
			"credits-quota", quota, "credits-granted", granted, "credits-grants", grants), 30*time.Second)
	}
	credits("100", "0", "no grants")
	require.Equal(t, "100", text("credits-capacity"))
	require.Equal(t, "demo-credits", text("credits-prefix"))
	require.Equal(t, "full · renewed on the 1st of each month (UTC)", text("credits-renews"))
	n := len(results())
	do("use up the quota", click("credits-use-up"))
	waitFor("the quota used up", fmt.Sprintf(q+`.textContent.startsWith('Quota used up:')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Quota used up: 14 charges of 7 passed, then 429 Too Many Requests. Denied: a charge of 7 is more than the 2 left "+
		"of the monthly quota and the 0 granted; nothing taken. The quota renews in T; or grant credits.", renews(text("credits-status")))
	charges := results()[n:]
	require.Len(t, charges, 15)
	require.Regexp(t, `^#\d+ 200 OK cost 7 RateLimit: "demo-credits";r=93;t=\d+ Charged 7 from the monthly quota: 93 of 100 left, 0 granted\.`, charges[0])
	require.Regexp(t, `^#\d+ 429 Too Many Requests cost 7 RateLimit: "demo-credits";r=2;t=\d+ Retry-After: \d+ Denied: `, charges[14])
	credits("2", "0", "no grants")
	require.Regexp(t, `^back to 100 in .+ · renewed on the 1st of each month \(UTC\)$`, text("credits-renews"))
	do("grant 10", click("credits-grant-10"))
	waitFor("the grant", fmt.Sprintf(q+`.textContent.startsWith('Granted')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Granted 10 credits (never expires): 10 granted in all, beside the quota's 2 of 100.", text("credits-status"))
	credits("2", "10", "10 credits, never expire")
	do("charge 4", click("credits-charge-4"))
	waitFor("the charge", fmt.Sprintf(q+`.textContent.startsWith('Charged 4')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left).", text("credits-status"))
	credits("0", "8", "8 credits, never expire")
	require.Equal(t, "0%", eval(fmt.Sprintf(q+`.style.width`, "credits-quota-gauge")))
	require.Equal(t, "8%", eval(fmt.Sprintf(q+`.style.width`, "credits-granted-gauge")))
	// A charge beyond both is denied and takes nothing.
	do("charge 20", setValue("credits-cost", "20"), click("credits-charge"))
	waitFor("the denial", fmt.Sprintf(q+`.textContent.startsWith('429')`, "credits-status"), 30*time.Second)
	require.Equal(t, "429 Too Many Requests. Denied: a charge of 20 is more than the 0 left of the monthly quota and the 8 granted; "+
		"nothing taken. The quota renews in T; or grant credits.", renews(text("credits-status")))
	credits("0", "8", "8 credits, never expire")
	do("start over", click("credits-reset"))
	waitFor("a fresh start", fmt.Sprintf(q+`.textContent.startsWith('Started over')`, "credits-status"), 30*time.Second)
	credits("100", "0", "no grants")
	// The whole sequence, from the scenarios.
	do("the credits scenario", click("scenario-credits"))
	waitFor("credits", fmt.Sprintf(q+`.textContent.startsWith('Credits:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Credits: used up the quota, granted 10, charged 4. Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left).",
		text("scenario-status"))
	credits("0", "8", "8 credits, never expire")

	// Something to look at: a burst under a policy that refills a token a
	// second, and the bucket refilling step by step on its grid.
	do("a policy to watch", setValue("capacity", "8"), setValue("refill", "1"), setValue("interval", "1s"), setValue("storage", "ephemeral"), click("apply"))
	waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '8'`, "remaining"), 30*time.Second)
	time.Sleep(2 * time.Second) // the chart shows a full bucket first
	do("a burst by hand", setValue("burst-size", "11"), click("send-burst"))
	waitFor("the burst", fmt.Sprintf(q+`.textContent.startsWith('Burst of 11:')`, "scenario-status"), time.Minute)
	waitFor("refills", fmt.Sprintf(`Number(`+q+`.textContent) >= 5`, "remaining"), 30*time.Second)
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	shot := filepath.Join(t.TempDir(), "demo.png")
	if os.Getenv("PGRATELIMIT_UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "..", "..", "docs", "demo.png")
		require.NoError(t, os.MkdirAll(filepath.Dir(shot), 0o755))
	}
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot: %s", shot)

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, consoleErrors, "console errors")
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

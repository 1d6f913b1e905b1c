package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// chromium is Debian's Chromium, which .ci/run installs.
const chromium = "/usr/bin/chromium"

// q selects the page's element of a data-testid, in JavaScript.
const q = `document.querySelector('[data-testid="%s"]')`

// The page in a real browser: a burst shows 200s then 429s, the token count
// drops to 0 and refills, a new policy applies, the rollback scenario spends
// nothing, the credits gauges follow a monthly quota used up, a grant and a
// charge that spills into it, with the usage alerts they fire, delivered,
// jobs take the slots of a semaphore, one killed gives its slot back when
// its lease expires, and the console stays free of errors. With
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
	page := startDemo(t, schema.URL(t), jobsConfig{})
	db := schema.Pool(t, 1)
	b, consoleErrors := startBrowser(t)

	b.do("open the page", chromedp.Navigate(page))
	b.waitFor("the first state", fmt.Sprintf(`/^\d+$/.test(`+q+`.textContent)`, "remaining"), time.Minute)
	require.Equal(t, "ip:127.0.0.1", b.text("key"))
	b.checkWaits()
	b.checkBurst(db)
	b.checkScenarios()
	b.checkCredits(db)
	b.checkJobs()
	b.checkBadCost()
	b.screenshot()
	require.Empty(t, consoleErrors(), "console errors")
}

// browser is a headless Chromium on the demo's page.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// startBrowser starts Chromium, stopped when the test ends, and returns it
// with the console's errors so far. The browser logs each 429 that fetch
// receives as a network error: those are the demo working, as are the 400s
// of the policy and of the cost of 0 the test gets refused on purpose.
func startBrowser(t *testing.T) (b *browser, consoleErrors func() []string) {
	// Generous timeouts: the test shares the machine with the rest of make
	// test (load averages of 5-8 on 2 cores), and they only bound failures.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
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
	t.Cleanup(cancel)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)

	var mu sync.Mutex
	var errs []string
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
				strings.Contains(m.Text, "400 (Bad Request)") && (strings.HasSuffix(m.URL, "/api/policy") || strings.HasSuffix(m.URL, "/api/limited?cost=0"))) {
				continue
			}
			mu.Lock()
			errs = append(errs, m.String()+" at "+m.URL)
			mu.Unlock()
		}
	}()
	return &browser{t: t, ctx: bctx}, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, actions...), what)
}

func (b *browser) eval(js string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js))
	require.NoError(b.t, err, js)
	return s
}

// waitFor polls a JavaScript condition in the page.
func (b *browser) waitFor(what, cond string, timeout time.Duration) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](cond,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	require.NoError(b.t, err, "waiting for %s (%s)", what, cond)
}

// text is the text of the element of data-testid id.
func (b *browser) text(id string) string { return b.eval(fmt.Sprintf(q+`.textContent`, id)) }

// results are the texts of the responses logged.
func (b *browser) results() []string {
	b.t.Helper()
	var out []string
	require.NoError(b.t, json.Unmarshal([]byte(b.eval(`JSON.stringify([...document.querySelectorAll('[data-testid="result"]')].map(e => e.textContent))`)), &out))
	return out
}

func setValue(id, v string) chromedp.Action[chromedp.Void] {
	return chromedp.SetValue(fmt.Sprintf(`[data-testid="%s"]`, id), v)
}

// click waits until no scenario runs (they disable the buttons), then
// clicks.
func click(id string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		idle := chromedp.Poll[chromedp.Void](fmt.Sprintf(`!`+q+`.disabled`, id),
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(time.Minute))
		if _, err := idle(ctx, tg); err != nil {
			return chromedp.Void{}, err
		}
		return chromedp.Click(fmt.Sprintf(`[data-testid="%s"]`, id))(ctx, tg)
	}
}

// checkWaits: the page says waits as the CLI does (human.Duration), to the
// tenth of a second below 10s where the CLI gives the millisecond.
func (b *browser) checkWaits() {
	t := b.t
	waits := []int64{10000, 19001, 20000, 59500, 60000, 724100, 3*3600000 + 12*60000, 3 * 3600000, 3*3600000 + 1000,
		86370000, (5*24 + 14) * 3600000, 134*3600000 + 48*60000 + 31000, 40 * 24 * 3600000}
	var said []string
	require.NoError(t, json.Unmarshal([]byte(b.eval(fmt.Sprintf(`JSON.stringify(%s.map(fmtMs))`, mustJSON(t, waits)))), &said))
	for i, ms := range waits {
		require.Equal(t, human.Duration(time.Duration(ms)*time.Millisecond), said[i], "fmtMs(%d)", ms)
	}
	require.Equal(t, `["0s","412ms","4.4s","9.9s","10s"]`, b.eval(`JSON.stringify([0, 412, 4306, 9900, 9950].map(fmtMs))`))
}

// checkBurst: one request, then a slow policy and a burst that shows 200s,
// then 429s, the bucket at 0 and refilled on its grid.
func (b *browser) checkBurst(db *pgxpool.Pool) {
	t := b.t
	b.do("send one", click("send"))
	b.waitFor("its response", `document.querySelectorAll('[data-testid="result"]').length === 1`, 30*time.Second)
	require.Regexp(t, `^#1 (200 OK|429 Too Many Requests) cost 1 RateLimit: "demo";r=\d;t=\d`, b.results()[0])

	// A policy whose refills are slow enough to watch the bucket at 0.
	b.do("a slow policy", setValue("capacity", "5"), setValue("refill", "1"), setValue("interval", "3s"), click("apply"))
	b.waitFor("the policy", fmt.Sprintf(q+`.textContent.includes('Refill 1 every 3s')`, "policy"), 30*time.Second)
	b.waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '5'`, "remaining"), 30*time.Second)

	burst := b.burstBetweenRefills(db)
	var statuses []string
	for _, r := range burst {
		statuses = append(statuses, regexp.MustCompile(`^#\d+ (\d{3}) `).FindStringSubmatch(r)[1])
	}
	require.Equal(t, []string{"200", "200", "200", "200", "200", "429", "429", "429"}, statuses, "%q", burst)
	require.Contains(t, burst[5], "Retry-After: ")
	require.Equal(t, "Burst of 8 from a full bucket of 5: 5 allowed (200), 3 denied (429).", b.text("scenario-status"))

	// The token count reaches 0, then refills on the grid.
	b.waitFor("an empty bucket", fmt.Sprintf(q+`.textContent === '0'`, "remaining"), 30*time.Second)
	b.waitFor("a refill", fmt.Sprintf(q+`.textContent === '1'`, "remaining"), 30*time.Second)
}

// burstBetweenRefills runs the burst scenario between two refills and
// returns its responses. Refills fall every 3s on the database clock's
// grid; the burst starts just after one and must end in the first 2s of
// it, so that the bucket shows 0 for a while after; one that did not (a
// slow machine) is run again.
func (b *browser) burstBetweenRefills(db *pgxpool.Pool) []string {
	t := b.t
	for attempt := 1; ; attempt++ {
		start := afterRefill(t, db, 3*time.Second)
		n := len(b.results())
		b.eval(fmt.Sprintf(`(`+q+`.textContent = "", "")`, "scenario-status")) // not the last attempt's
		b.do("the burst scenario", click("scenario-burst"))
		b.waitFor("the burst", fmt.Sprintf(q+`.textContent.startsWith('Burst of 8')`, "scenario-status"), time.Minute)
		if end := dbNow(t, db); end.Before(start.Add(2 * time.Second)) {
			return b.results()[n:]
		} else if attempt == 5 {
			t.Fatalf("5 bursts of 8 requests each took more than 2s (the last %s): the machine is too slow for this test", end.Sub(start))
		} else {
			t.Logf("the burst ended %s after the refill, past the 2s it has: again", end.Sub(start))
		}
	}
}

// checkScenarios: another policy with steady traffic, a policy refused,
// the rollback and two limits.
func (b *browser) checkScenarios() {
	t := b.t
	// Another policy: a new limiter, a fresh bucket.
	b.do("a fast policy", setValue("capacity", "3"), setValue("refill", "2"), setValue("interval", "500ms"), setValue("storage", "durable"), click("apply"))
	b.waitFor("the policy", fmt.Sprintf(q+`.textContent.includes('Capacity 3, Refill 2 every 500ms, durable')`, "policy"), 30*time.Second)
	b.waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '3'`, "remaining"), 30*time.Second)

	// Steady traffic at 90% of the refill rate: every request allowed.
	b.do("the steady scenario", click("scenario-steady"))
	b.waitFor("steady", fmt.Sprintf(q+`.textContent.startsWith('Steady, at 90%% of the refill rate:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Steady, at 90% of the refill rate: 12 of 12 allowed.", b.text("scenario-status"))

	// A policy the limiter refuses says why, on the page.
	b.do("a bad interval", setValue("interval", "soon"), click("apply"))
	b.waitFor("the refusal", fmt.Sprintf(q+`.textContent.includes('Interval must be')`, "scenario-status"), 30*time.Second)
	require.Equal(t, `Interval must be a positive duration such as 1s, 500ms or 1m, got "soon"`, b.text("scenario-status"))
	require.Contains(t, b.text("policy"), "Capacity 3, Refill 2 every 500ms, durable", "the policy stays")

	// Credits charged in a transaction that rolls back: nothing spent.
	b.do("the rollback scenario", click("scenario-rollback"))
	b.waitFor("the rollback", fmt.Sprintf(q+`.textContent.startsWith('Rollback:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Rollback: charged 3 inside a transaction (3 → 0 tokens, seen inside it); then its work failed "+
		"(ERROR: division by zero (SQLSTATE 22012)) and it rolled back: the bucket has 3 of 3, nothing spent.", b.text("scenario-status"))

	// Two limits at once.
	b.do("the two-limits scenario", click("scenario-two-limits"))
	b.waitFor("two limits", fmt.Sprintf(q+`.textContent.includes('Requests denied by one limit took nothing from the other')`, "scenario-status"), 30*time.Second)
	// The per-minute limit (6) refills whole at each minute of the grid:
	// a scenario that spans one (a busy machine) may be allowed more.
	require.Regexp(t, `^Two limits: [1-9] of 9 allowed; denied: `, b.text("scenario-status"))
	require.Regexp(t, `^[0-6] of 6$`, b.text("minute"))
}

// credits waits until the credits card shows quota and granted.
func (b *browser) credits(quota, granted string) {
	b.t.Helper()
	b.waitFor("quota "+quota+", granted "+granted, fmt.Sprintf(q+`.textContent === '%s' && `+q+`.textContent === '%s'`,
		"credits-quota", quota, "credits-granted", granted), 30*time.Second)
}

// checkCredits: credits, step by step: the monthly quota used up (a 429
// that says why), with the alerts it fires (delivered: in the database,
// where the operator UI the card links to reads them), a grant, and a
// charge that spills from the quota into it; a denial beyond both;
// starting over; the whole sequence from the scenarios.
func (b *browser) checkCredits(db *pgxpool.Pool) {
	t := b.t
	b.credits("100", "0")
	require.Equal(t, "100", b.text("credits-capacity"))
	require.Equal(t, "demo-credits", b.text("credits-prefix"))
	require.Equal(t, "full · renewed on the 1st of each month (UTC)", b.text("credits-renews"))
	require.Equal(t, "admin/key?prefix=demo-credits&key=ip%3A127.0.0.1", b.eval(fmt.Sprintf(q+`.getAttribute('href')`, "credits-admin")))
	require.Empty(t, deliveredAlerts(t, db))
	n := len(b.results())
	b.do("use up the quota", click("credits-use-up"))
	b.waitFor("the quota used up", fmt.Sprintf(q+`.textContent.startsWith('Quota used up:')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Quota used up: 14 charges of 7 passed, then 429 Too Many Requests. Denied: a charge of 7 is more than the 2 left "+
		"of the monthly quota and the 0 granted; nothing taken. The quota renews in T; or grant credits.", renews(b.text("credits-status")))
	charges := b.results()[n:]
	require.Len(t, charges, 15)
	require.Regexp(t, `^#\d+ 200 OK cost 7 RateLimit: "demo-credits";r=93;t=\d+ Charged 7 from the monthly quota: 93 of 100 left, 0 granted\.`, charges[0])
	require.Regexp(t, `^#\d+ 429 Too Many Requests cost 7 RateLimit: "demo-credits";r=2;t=\d+ Retry-After: \d+ Denied: `, charges[14])
	b.credits("2", "0")
	require.Equal(t, alertsOfUsedUp, deliveredAlerts(t, db))
	require.Regexp(t, `^back to 100 in .+ · renewed on the 1st of each month \(UTC\)$`, b.text("credits-renews"))
	b.do("grant 10", click("credits-grant-10"))
	b.waitFor("the grant", fmt.Sprintf(q+`.textContent.startsWith('Granted')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Granted 10 credits (never expires): 10 granted in all, beside the quota's 2 of 100.", b.text("credits-status"))
	b.credits("2", "10")
	b.do("charge 4", click("credits-charge-4"))
	b.waitFor("the charge", fmt.Sprintf(q+`.textContent.startsWith('Charged 4')`, "credits-status"), 30*time.Second)
	require.Equal(t, "Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left).", b.text("credits-status"))
	b.credits("0", "8")
	require.Equal(t, alertsOfAll, deliveredAlerts(t, db))
	require.Equal(t, "0%", b.eval(fmt.Sprintf(q+`.style.width`, "credits-quota-gauge")))
	require.Equal(t, "8%", b.eval(fmt.Sprintf(q+`.style.width`, "credits-granted-gauge")))
	b.checkCreditsAgain(db)
}

// checkCreditsAgain: a charge beyond the quota and the grants is denied
// and takes nothing (and fires nothing: the denial fired this month);
// starting over clears the card, alerts too, and the credits scenario
// plays it all again.
func (b *browser) checkCreditsAgain(db *pgxpool.Pool) {
	t := b.t
	b.do("charge 20", setValue("credits-cost", "20"), click("credits-charge"))
	b.waitFor("the denial", fmt.Sprintf(q+`.textContent.startsWith('429')`, "credits-status"), 30*time.Second)
	require.Equal(t, "429 Too Many Requests. Denied: a charge of 20 is more than the 0 left of the monthly quota and the 8 granted; "+
		"nothing taken. The quota renews in T; or grant credits.", renews(b.text("credits-status")))
	b.credits("0", "8")
	require.Equal(t, alertsOfAll, deliveredAlerts(t, db))
	b.do("start over", click("credits-reset"))
	b.waitFor("a fresh start", fmt.Sprintf(q+`.textContent.startsWith('Started over')`, "credits-status"), 30*time.Second)
	b.credits("100", "0")
	require.Empty(t, deliveredAlerts(t, db))
	// The whole sequence, from the scenarios.
	b.do("the credits scenario", click("scenario-credits"))
	b.waitFor("credits", fmt.Sprintf(q+`.textContent.startsWith('Credits:')`, "scenario-status"), 30*time.Second)
	require.Equal(t, "Credits: used up the quota, granted 10, charged 4. Charged 4: 2 from the monthly quota (0 of 100 left), 2 from grants (8 left).",
		b.text("scenario-status"))
	b.credits("0", "8")
	require.Equal(t, alertsOfAll, deliveredAlerts(t, db))
}

// checkBadCost: a cost of 0 typed in the Cost field is sent as it is, and
// refused (400) as bad input, in the library's words.
func (b *browser) checkBadCost() {
	t := b.t
	b.do("a cost of 0", setValue("cost", "0"), click("send"))
	b.waitFor("its answer", `[...document.querySelectorAll('[data-testid="result"]')].at(-1)?.textContent.includes('cost 0')`, 30*time.Second)
	require.Regexp(t, `^#\d+ 400 Bad Request cost 0 400 bad request: pgratelimit: invalid cost: 0 is below 1 \d+ ms$`, b.results()[len(b.results())-1])
	b.do("a cost of 1 again", setValue("cost", "1"))
}

// screenshot: something to look at, under the policy the demo starts with
// (Capacity 5, a token a second): a burst, and the bucket refilling step by
// step on its grid, and a job running beside one killed; saved as
// docs/demo.png with PGRATELIMIT_UPDATE_SCREENSHOT=1.
func (b *browser) screenshot() {
	t := b.t
	b.do("the demo's first policy", setValue("capacity", "5"), setValue("refill", "1"), setValue("interval", "1s"), setValue("storage", "ephemeral"), click("apply"))
	b.waitFor("a fresh bucket", fmt.Sprintf(q+`.textContent === '5'`, "remaining"), 30*time.Second)
	time.Sleep(2 * time.Second) // the chart shows a full bucket first
	b.do("a burst by hand", setValue("burst-size", "8"), click("send-burst"))
	b.waitFor("the burst", fmt.Sprintf(q+`.textContent.startsWith('Burst of 8:')`, "scenario-status"), time.Minute)
	b.waitFor("the bucket emptied", fmt.Sprintf(`Number(`+q+`.textContent) <= 1`, "remaining"), 30*time.Second)
	b.waitFor("refills", fmt.Sprintf(`Number(`+q+`.textContent) >= 3`, "remaining"), 30*time.Second)
	// The jobs card: a job running, one killed (its slot still held, for up
	// to 10s), a slot free.
	b.do("start over", click("jobs-reset"))
	b.waitFor("a fresh start", fmt.Sprintf(q+`.textContent.startsWith('Started over')`, "jobs-status"), 30*time.Second)
	for i := 1; i <= 2; i++ {
		b.do("start a job", click("jobs-start"))
		b.waitFor("the job", fmt.Sprintf(q+`.textContent.includes('%d of 3 slots held')`, "jobs-status", i), 30*time.Second)
	}
	b.do("kill a holder", click("jobs-kill"))
	b.slots("killed", "running", "free")
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	shot := filepath.Join(t.TempDir(), "demo.png")
	if os.Getenv("PGRATELIMIT_UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "..", "..", "docs", "demo.png")
		require.NoError(t, os.MkdirAll(filepath.Dir(shot), 0o755))
	}
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot: %s", shot)
}

// slots waits until the jobs card's slots are in the states want (running,
// killed, other or free), in their order.
func (b *browser) slots(want ...string) {
	b.t.Helper()
	list := `JSON.stringify([...document.querySelectorAll('[data-testid="jobs-slot"]')].map(e => e.dataset.state))`
	b.waitFor(fmt.Sprintf("the slots %q", want), list+` === '`+mustJSON(b.t, want)+`'`, 30*time.Second)
}

// slotText is the text of the jobs card's slot i (from 0).
func (b *browser) slotText(i int) string {
	return b.eval(fmt.Sprintf(`document.querySelectorAll('[data-testid="jobs-slot"]')[%d].textContent`, i))
}

// checkJobs: three long jobs take the three slots, each with its fencing
// token and countdowns; a fourth gets a 429 that says why; a holder killed
// keeps its slot, counting down, until its lease expires (TTL 10s), then
// the slot is free and a job starts again.
func (b *browser) checkJobs() {
	t := b.t
	require.Equal(t, "demo-jobs", b.text("jobs-prefix"))
	b.do("start over", click("jobs-reset"))
	b.waitFor("a fresh start", fmt.Sprintf(q+`.textContent.startsWith('Started over')`, "jobs-status"), 30*time.Second)
	b.slots("free", "free", "free")
	require.Equal(t, "admin/key?prefix=demo-jobs&key=ip%3A127.0.0.1", b.eval(fmt.Sprintf(q+`.getAttribute('href')`, "jobs-admin")))
	require.Equal(t, "Max 3 slots per key, TTL 10s: a lease counts until released, or until 10s pass without an Extend. "+
		"A job runs 30s and extends its lease every 3.4s. 0 of 3 held.", b.text("jobs-policy"))
	for i := 1; i <= 3; i++ {
		b.do("start a job", click("jobs-start"))
		b.waitFor("the job", fmt.Sprintf(q+`.textContent.includes('%d of 3 slots held')`, "jobs-status", i), 30*time.Second)
	}
	require.Regexp(t, `^Started a job with lease token \d+: it runs 30s, extending its lease every 3\.334s, then releases it\. 3 of 3 slots held\.$`, b.text("jobs-status"))
	b.slots("running", "running", "running")
	require.Equal(t, "slot 1 job running extends its lease", b.slotText(0))

	b.do("a fourth job", click("jobs-start"))
	b.waitFor("the denial", fmt.Sprintf(q+`.textContent.startsWith('429')`, "jobs-status"), 30*time.Second)
	require.Regexp(t, `^429 Too Many Requests\. Denied: all 3 slots are held \(3 of 3\), so no job started\. The soonest lease expires in \S+; a job that ends releases its slot sooner\.$`, b.text("jobs-status"))
	require.Regexp(t, `^#\d+ 429 Too Many Requests cost 1 Retry-After: \d+ Denied: all 3 slots are held`, b.results()[len(b.results())-1])

	b.do("kill a holder", click("jobs-kill"))
	b.waitFor("the kill", fmt.Sprintf(q+`.textContent.startsWith('Killed')`, "jobs-status"), 30*time.Second)
	b.slots("killed", "running", "running")
	require.Equal(t, "slot 1 killed: no heartbeat, no release back when its lease expires", b.slotText(0))
	// Its slot comes back when its lease expires, at most 10s after its
	// last heartbeat; the others' heartbeats keep theirs.
	b.slots("running", "running", "free")
	b.do("start again", click("jobs-start"))
	b.waitFor("the job", fmt.Sprintf(q+`.textContent.includes('3 of 3 slots held')`, "jobs-status"), 30*time.Second)
	b.slots("running", "running", "running")
}

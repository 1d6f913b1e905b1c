package demo

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/ui"
)

// The operator UI in a real browser, mounted by the demo at /admin/: find
// the client's key, open it, grant credits through the form and see the
// balance and the ledger change; a form without the CSRF token is refused
// and grants nothing; an override through its form changes the plan at
// once; a read-only UI shows no action. With
// PGRATELIMIT_UPDATE_SCREENSHOT=1 it saves docs/ui.png.
func TestOperatorUI(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no Chromium at %s (apt-get install chromium): %v", chromium, err)
		}
		t.Skipf("no Chromium at %s (apt-get install chromium)", chromium)
	}
	t.Parallel()
	schema := testdb.NewEmptySchema(t)
	page := startDemo(t, schema.URL(t), jobsConfig{})
	// Some history: credits charged through the demo's API (a ledger row
	// each, and usage alerts), and a job holding a lease.
	for _, cost := range []string{"30", "55"} {
		require.Equal(t, http.StatusOK, getJSON(t, http.MethodPost, page+"api/credits/charge?cost="+cost, nil, nil))
	}
	require.Equal(t, http.StatusOK, getJSON(t, http.MethodPost, page+"api/jobs/start", nil, nil))
	b, consoleErrors := startBrowser(t)
	const key = "ip:127.0.0.1"

	b.do("open the UI", chromedp.Navigate(page+"admin/"))
	b.waitLoad("the prefixes", fmt.Sprintf(q+` !== null`, "prefix-"+creditsPrefix), time.Minute)
	b.do("search the key", chromedp.SetValue(`select[name="prefix"]`, creditsPrefix), setValue("search-match", "ip:"),
		chromedp.Submit(`[data-testid="search"]`))
	b.waitLoad("the results", fmt.Sprintf(`[...%s.querySelectorAll('a')].some(a => a.textContent === '%s')`,
		fmt.Sprintf(q, "keys"), key), time.Minute)
	b.do("open the key", chromedp.Click(fmt.Sprintf(`[data-testid="keys"] a[href*="%s"]`, url.QueryEscape(key))))
	b.waitLoad("the key's page", fmt.Sprintf(q+` !== null`, "grant-form"), time.Minute)
	require.Equal(t, key, b.text("key"))
	require.Equal(t, "15", b.text("remaining"))
	require.Equal(t, "0", b.text("granted"))
	rows := b.ledgerRows()
	require.Len(t, rows, 2)

	b.do("grant 40", setValue("grant-amount", "40"), chromedp.Click(`[data-testid="grant-submit"]`))
	b.waitLoad("the grant", fmt.Sprintf(q+` !== null`, "done"), time.Minute)
	require.Equal(t, "Granted.", b.text("done"))
	require.Equal(t, "40", b.text("granted"))
	require.Equal(t, "15", b.text("remaining"))
	rows = b.ledgerRows()
	require.Len(t, rows, 3)
	require.Contains(t, rows[0], "grant")

	// A form without the token, as another site's page would post it.
	b.do("post a form without the token", chromedp.Evaluate[chromedp.Void](`(() => {
		const f = document.createElement('form');
		f.method = 'post';
		f.action = 'grant';
		for (const [k, v] of [['prefix', '`+creditsPrefix+`'], ['key', '`+key+`'], ['amount', '5']]) {
			const i = document.createElement('input');
			i.name = k;
			i.value = v;
			f.appendChild(i);
		}
		document.body.appendChild(f);
		f.submit();
	})()`))
	b.waitLoad("the refusal", `document.body.textContent.includes('CSRF token is missing')`, time.Minute)
	b.do("open the key again", chromedp.Navigate(page+"admin/key?"+url.Values{"prefix": {creditsPrefix}, "key": {key}}.Encode()))
	b.waitLoad("the key's page", fmt.Sprintf(q+` !== null`, "granted"), time.Minute)
	require.Equal(t, "40", b.text("granted"), "the refused form granted nothing")
	require.Len(t, b.ledgerRows(), 3)

	// An override: a bigger plan for this customer, at once.
	b.do("override", setValue("override-capacity", "200"), setValue("override-refill", "200"),
		chromedp.SetValue(`input[name="note"]`, "enterprise trial"), chromedp.Click(`[data-testid="override-submit"]`))
	b.waitLoad("the override", fmt.Sprintf(q+` !== null`, "done"), time.Minute)
	require.Contains(t, b.text("override"), "Capacity 200, +200 a refill, with no end: “enterprise trial”")
	require.Equal(t, "200", b.text("limit"))
	require.Equal(t, "115", b.text("remaining"), "the difference, at once")
	rows = b.ledgerRows()
	require.Len(t, rows, 4)
	require.Contains(t, rows[0], "plan")
	b.uiScreenshot()

	// The same UI, read-only, beside the demo.
	ro := readOnlyUI(t, schema.URL(t))
	for _, p := range []string{"", "keys?prefix=" + creditsPrefix, "key?" + url.Values{"prefix": {creditsPrefix}, "key": {key}}.Encode(),
		"key?" + url.Values{"prefix": {jobsPrefix}, "key": {key}}.Encode()} {
		b.do("open the read-only UI", chromedp.Navigate(ro+"/"+p))
		b.waitLoad("the page", fmt.Sprintf(q+` !== null`, "read-only"), time.Minute)
		require.Equal(t, "0", b.eval(`String(document.querySelectorAll('form[method="post"]').length)`), p)
	}

	var errs []string
	for _, e := range consoleErrors() {
		// The refused form's 403, and the icon Chromium asks for on its
		// answer (plain text, with no icon link).
		if !strings.Contains(e, "403") && !strings.Contains(e, "/favicon.ico") {
			errs = append(errs, e)
		}
	}
	require.Empty(t, errs, "console errors")
}

// waitLoad is waitFor on a page being loaded: a poll that the navigation
// interrupts ("Cannot find context", "Inspected target navigated")
// polls again on the new page.
func (b *browser) waitLoad(what, cond string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](cond,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(time.Until(deadline))))
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "context") && !strings.Contains(err.Error(), "navigated") || time.Now().After(deadline) {
			require.NoError(b.t, err, "waiting for %s (%s)", what, cond)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ledgerRows are the texts of the key page's ledger rows, newest first.
func (b *browser) ledgerRows() []string {
	b.t.Helper()
	n, err := strconv.Atoi(b.eval(`String(document.querySelectorAll('[data-testid="ledger-row"]').length)`))
	require.NoError(b.t, err)
	var rows []string
	for i := range n {
		rows = append(rows, b.eval(fmt.Sprintf(`document.querySelectorAll('[data-testid="ledger-row"]')[%d].textContent`, i)))
	}
	return rows
}

// readOnlyUI serves a read-only UI of the demo's credits and jobs on the
// database of dbURL, and returns its address.
func readOnlyUI(t *testing.T, dbURL string) string {
	t.Helper()
	db, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	credits, err := pgratelimit.New(db, creditsPolicy())
	require.NoError(t, err)
	jobs, err := pgratelimit.NewSemaphore(db, pgratelimit.SemaphoreConfig{Prefix: jobsPrefix, Max: jobsMax, TTL: 10 * time.Second})
	require.NoError(t, err)
	h, err := ui.NewHandler(ui.Config{Pool: db, Limiters: []*pgratelimit.Limiter{credits}, Semaphores: []*pgratelimit.Semaphore{jobs}, ReadOnly: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// uiScreenshot saves the key's page, as docs/ui.png with
// PGRATELIMIT_UPDATE_SCREENSHOT=1.
func (b *browser) uiScreenshot() {
	t := b.t
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	shot := filepath.Join(t.TempDir(), "ui.png")
	if os.Getenv("PGRATELIMIT_UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "..", "..", "docs", "ui.png")
	}
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot: %s", shot)
}

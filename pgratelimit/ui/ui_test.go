package ui

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// TestMain points DATABASE_URL at a fresh, migrated schema for the
// example.
func TestMain(m *testing.M) { testdb.Main(testdb.Examples(m)) }

// bundle is a UI on a fresh schema: its limiter of credits (grants, a
// ledger, alerts), its semaphore of jobs, and a browser of it.
type bundle struct {
	pool    *pgxpool.Pool
	credits *pgratelimit.Limiter
	jobs    *pgratelimit.Semaphore
	b       *browser
}

func setup(t *testing.T, cfg Config, mount string) *bundle {
	t.Helper()
	pool := testdb.Pool(t)
	credits, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "credits", Capacity: 100, Refill: 100,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Grants: true, Ledger: true,
		Alerts: pgratelimit.Alerts{Exhausted: true}})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "jobs", Max: 3, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pool, cfg.Limiters, cfg.Semaphores = pool, []*pgratelimit.Limiter{credits}, []*pgratelimit.Semaphore{jobs}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(mount, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &bundle{pool: pool, credits: credits, jobs: jobs, b: &browser{t: t, c: c, base: srv.URL}}
}

// browser is an HTTP client with cookies that does not follow redirects.
type browser struct {
	t    *testing.T
	c    *http.Client
	base string
}

// get returns the status and body of a GET of path.
func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post posts form to path, with the headers h, and returns the response
// (its body read).
func (b *browser) post(path string, form url.Values, h map[string]string) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

var tokenField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// token is the CSRF token of the forms of page.
func token(t *testing.T, page string) string {
	t.Helper()
	m := tokenField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

func form(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

func contains(t *testing.T, page string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("the page has no %q:\n%s", w, page)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "p", Capacity: 1, Refill: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ls := []*pgratelimit.Limiter{l}
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{Limiters: ls}, "Config.Pool"},
		{Config{Pool: pool}, "Config.Limiters"},
		{Config{Pool: pool, Limiters: []*pgratelimit.Limiter{l, nil}}, "Config.Limiters[1]"},
		{Config{Pool: pool, Limiters: []*pgratelimit.Limiter{l, l}}, "Config.Limiters[1]"},
		{Config{Pool: pool, Semaphores: []*pgratelimit.Semaphore{nil}}, "Config.Semaphores[0]"},
		{Config{Pool: pool, Limiters: ls, Prefix: "admin"}, "Config.Prefix"},
	} {
		_, err := NewHandler(c.cfg)
		var ce *pgratelimit.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, pgratelimit.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want a ConfigError of %s", c.cfg, err, c.field)
		}
	}
}

// The pages show the prefixes with their keys near and at their limit, the
// key search, and a key's balance, row, grants, ledger, request ID,
// leases and events; a key is escaped everywhere.
func TestPages(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{}, "/")
	ctx := context.Background()
	const evil = `<script>alert("x")</script>&`
	for _, k := range []string{"acme", "acme-2", evil} {
		if _, err := x.credits.AllowN(ctx, k, 95); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := x.credits.AllowN(pgratelimit.WithRequestID(ctx, "req-1"), "acme", 5); err != nil {
		t.Fatal(err)
	}
	if r, err := x.credits.AllowN(ctx, "acme", 1); err != nil || r.Allowed {
		t.Fatal(r, err) // denied: an exhausted event
	}
	if _, err := x.credits.Grant(ctx, "acme", 40, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := x.jobs.Acquire(ctx, "acme", 2); err != nil {
		t.Fatal(err)
	}

	code, page := x.b.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, page)
	}
	contains(t, page, `data-testid="prefix-credits"`, "capacity 100, &#43;100 each month", "grants, ledger, alerts",
		`<td class="n">3</td>`, `<td class="n" title="keys whose last check left them no token">1</td>`, "at most 3 at once")

	_, page = x.b.get("/keys?prefix=credits&match=acme")
	contains(t, page, `href="key?key=acme&amp;prefix=credits"`, `href="key?key=acme-2&amp;prefix=credits"`)
	if strings.Contains(page, "script") {
		t.Errorf("the search for acme found more:\n%s", page)
	}
	_, page = x.b.get("/keys?prefix=credits")
	contains(t, page, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;")
	if strings.Contains(page, evil) {
		t.Errorf("a key is not escaped:\n%s", page)
	}

	_, page = x.b.get("/key?prefix=credits&key=acme&request_id=req-1")
	contains(t, page, `data-testid="remaining">0<`, `data-testid="granted">40<`, "0 tokens as of", `data-testid="ledger-row"`,
		"req-1", "A charge of 5", "exhausted")
	_, page = x.b.get("/key?prefix=jobs&key=acme")
	contains(t, page, "at most 3 at once", `<td class="n">2</td>`, "No event.")
	_, page = x.b.get("/key?prefix=credits&key=" + url.QueryEscape(evil))
	if strings.Contains(page, evil) {
		t.Errorf("a key is not escaped:\n%s", page)
	}

	if code, page := x.b.get("/key?prefix=nope&key=acme"); code != http.StatusNotFound {
		t.Errorf("unknown prefix: %d\n%s", code, page)
	}
	if code, page := x.b.get("/key?prefix=credits&key="); code != http.StatusBadRequest {
		t.Errorf("no key: %d\n%s", code, page)
	}
	if code, _ := x.b.get("/static/style.css"); code != http.StatusOK {
		t.Errorf("style.css: %d", code)
	}
}

// Every action through its form: grant, refund, reset, release a lease,
// redeliver an event; a bad amount shows the key's page with the error.
func TestActions(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{}, "/")
	ctx := context.Background()
	_, page := x.b.get("/key?prefix=credits&key=acme")
	tok := token(t, page)
	act := func(path string, f url.Values, wantStatus int) string {
		t.Helper()
		f.Set("csrf", tok)
		resp, body := x.b.post(path, f, nil)
		if resp.StatusCode != wantStatus {
			t.Fatalf("POST %s %v: %d, want %d\n%s", path, f, resp.StatusCode, wantStatus, body)
		}
		return resp.Header.Get("Location")
	}
	peek := func() pgratelimit.Result {
		t.Helper()
		r, err := x.credits.Peek(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	loc := act("/grant", form("prefix", "credits", "key", "acme", "amount", "25", "expires", "720h"), http.StatusSeeOther)
	if loc != "key?key=acme&prefix=credits&done=grant" {
		t.Errorf("Location %q", loc)
	}
	if r := peek(); r.Granted != 25 {
		t.Errorf("after the grant: %+v", r)
	}
	_, page = x.b.get("/" + loc)
	contains(t, page, "Granted.", `data-testid="granted">25<`)
	if _, err := x.credits.AllowN(ctx, "acme", 100); err != nil {
		t.Fatal(err)
	}
	act("/refund", form("prefix", "credits", "key", "acme", "amount", "10"), http.StatusSeeOther)
	if r := peek(); r.Remaining != 10 {
		t.Errorf("after the refund: %+v", r)
	}
	act("/reset", form("prefix", "credits", "key", "acme"), http.StatusSeeOther)
	if r := peek(); r.Remaining != 100 || r.Granted != 25 {
		t.Errorf("after the reset: %+v", r)
	}
	es, err := x.credits.Ledger(ctx, "acme", time.Time{})
	if kinds := kindsOf(es); err != nil || kinds != "grant charge refund reset" {
		t.Errorf("ledger: %s, %v", kinds, err)
	}

	lr, err := x.jobs.Acquire(ctx, "acme", 1)
	if err != nil {
		t.Fatal(err)
	}
	act("/release", form("prefix", "jobs", "key", "acme", "lease", lr.Lease.ID), http.StatusSeeOther)
	if ls, err := x.jobs.Leases(ctx, "acme"); err != nil || len(ls) != 0 {
		t.Errorf("after the release: %v, %v", ls, err)
	}
	act("/release", form("prefix", "jobs", "key", "acme", "lease", lr.Lease.ID), http.StatusSeeOther) // (released: nil)

	for range 2 {
		if _, err := x.credits.AllowN(ctx, "acme", 100); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := events.List(ctx, x.pool, events.Filter{Key: "acme"})
	if err != nil || len(evs) != 1 {
		t.Fatal(evs, err)
	}
	act("/redeliver", form("prefix", "credits", "key", "acme", "event", itoa(evs[0].ID)), http.StatusSeeOther)
	act("/redeliver", form("prefix", "credits", "key", "acme", "event", itoa(evs[0].ID+1)), http.StatusNotFound)

	resp, body := x.b.post("/grant", form("prefix", "credits", "key", "acme", "amount", "-3", "csrf", tok), nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "amount must be a whole number") || !strings.Contains(body, `data-testid="remaining"`) {
		t.Errorf("a bad amount: %d\n%s", resp.StatusCode, body)
	}
	act("/grant", form("prefix", "nope", "key", "acme", "amount", "1"), http.StatusNotFound)
}

func kindsOf(es []pgratelimit.LedgerEntry) string {
	var ks []string
	for _, e := range es {
		ks = append(ks, e.Kind)
	}
	return strings.Join(ks, " ")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// An action without the browser's CSRF token, with another token, with no
// cookie, or from another origin is refused with 403, and does nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{}, "/")
	_, page := x.b.get("/key?prefix=credits&key=acme")
	tok := token(t, page)
	grant := form("prefix", "credits", "key", "acme", "amount", "5")
	other := strings.Repeat("ab", 32)
	for name, c := range map[string]struct {
		token   string
		headers map[string]string
	}{
		"no token":      {"", nil},
		"another token": {other, nil},
		"cross-site":    {tok, map[string]string{"Sec-Fetch-Site": "cross-site"}},
		"other origin":  {tok, map[string]string{"Origin": "https://evil.example"}},
	} {
		f := url.Values{}
		for k, v := range grant {
			f[k] = v
		}
		if c.token != "" {
			f.Set("csrf", c.token)
		}
		if resp, body := x.b.post("/grant", f, c.headers); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d\n%s", name, resp.StatusCode, body)
		}
	}
	// A browser with no cookie, with the page's token.
	nojar := &http.Client{CheckRedirect: x.b.c.CheckRedirect}
	grant.Set("csrf", tok)
	resp, err := nojar.PostForm(x.b.base+"/grant", grant)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("no cookie: %d", resp.StatusCode)
	}
	if r, err := x.credits.Peek(context.Background(), "acme"); err != nil || r.Granted != 0 {
		t.Errorf("something was granted: %+v, %v", r, err)
	}
	resp, _ = x.b.post("/grant", grant, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

// Read-only: no form posts, no token, every POST refused.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{ReadOnly: true}, "/")
	ctx := context.Background()
	if _, err := x.jobs.Acquire(ctx, "acme", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := x.credits.AllowN(ctx, "acme", 200); err != nil { // denied: an event
		t.Fatal(err)
	}
	for _, p := range []string{"/", "/keys?prefix=credits", "/key?prefix=credits&key=acme", "/key?prefix=jobs&key=acme"} {
		code, page := x.b.get(p)
		if code != http.StatusOK || strings.Contains(page, `method="post"`) || strings.Contains(page, `name="csrf"`) || !strings.Contains(page, "read-only") {
			t.Errorf("%s: %d\n%s", p, code, page)
		}
	}
	resp, _ := x.b.post("/reset", form("prefix", "credits", "key", "acme", "csrf", strings.Repeat("ab", 32)), nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST in read-only mode: %d", resp.StatusCode)
	}
}

// Mounted under /admin/ with Config.Prefix: its pages, its cookie's path,
// and its redirects stay under it.
func TestPrefix(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{Prefix: "/admin/"}, "/admin/")
	resp, err := x.b.c.Get(x.b.base + "/admin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 3 || resp.Header.Get("Location") != "/admin/" {
		t.Errorf("/admin: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	code, page := x.b.get("/admin/")
	if code != http.StatusOK || !strings.Contains(page, `href="keys?prefix=credits"`) || !strings.Contains(page, `href="static/style.css"`) {
		t.Fatalf("/admin/: %d\n%s", code, page)
	}
	if code, _ := x.b.get("/admin/static/style.css"); code != http.StatusOK {
		t.Errorf("style: %d", code)
	}
	_, page = x.b.get("/admin/key?prefix=credits&key=acme")
	u, _ := url.Parse(x.b.base + "/admin/")
	if cs := x.b.c.Jar.Cookies(u); len(cs) != 1 || cs[0].Name != csrfCookie {
		t.Errorf("cookies: %v", cs)
	}
	resp, _ = x.b.post("/admin/grant", form("prefix", "credits", "key", "acme", "amount", "5", "csrf", token(t, page)), nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("grant: %d", resp.StatusCode)
	}
	next, _ := resp.Location()
	if next.Path != "/admin/key" {
		t.Errorf("redirected to %s", next)
	}
	if code, page := x.b.get(next.RequestURI()); code != http.StatusOK || !strings.Contains(page, `data-testid="granted">5<`) {
		t.Errorf("%s: %d\n%s", next, code, page)
	}
}

func TestDur(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "-", pgratelimit.InfDuration: "never", 1500 * time.Microsecond: "2ms",
		12340 * time.Millisecond: "12.3s", 90*time.Minute + 1234*time.Millisecond: "1h30m1s", 86*time.Hour + 38*time.Minute: "3d15h"} {
		if got := dur(d); got != want {
			t.Errorf("dur(%s) = %q, want %q", d, got, want)
		}
	}
}

// The ledger shows 50 entries a page, newest first; "Older" pages back.
func TestLedgerPages(t *testing.T) {
	t.Parallel()
	x := setup(t, Config{}, "/")
	ctx := context.Background()
	for range 60 {
		if _, err := x.credits.Allow(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	rows := regexp.MustCompile(`data-testid="ledger-row"><td class="n">(\d+)</td>`)
	older := regexp.MustCompile(`href="(key\?[^"]*before=\d+)" data-testid="ledger-older"`)
	_, page := x.b.get("/key?prefix=credits&key=acme")
	ids := rows.FindAllStringSubmatch(page, -1)
	m := older.FindStringSubmatch(page)
	if len(ids) != 50 || ids[0][1] != "60" || ids[49][1] != "11" || m == nil {
		t.Fatalf("the first page: %d rows, older %v", len(ids), m)
	}
	_, page = x.b.get("/" + strings.ReplaceAll(m[1], "&amp;", "&"))
	ids = rows.FindAllStringSubmatch(page, -1)
	if len(ids) != 10 || ids[0][1] != "10" || ids[9][1] != "1" || older.MatchString(page) || !strings.Contains(page, ">Newest</a>") {
		t.Errorf("the second page: %v\n%s", ids, page)
	}
}

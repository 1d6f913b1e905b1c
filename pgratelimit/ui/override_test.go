package ui

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A limiter with Config.Overrides: the key's page shows its override and
// sets and clears it through the form; the prefixes page and the policies
// page compare the recorded policies with the UI's limiter.
func TestOverrides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pgratelimit.Config{Prefix: "api", Capacity: 10, Refill: 1, Interval: time.Second, Overrides: true, Ledger: true}
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(ctx, "acme", 4); err != nil { // (records the policy)
		t.Fatal(err)
	}
	h, err := NewHandler(Config{Pool: pool, Limiters: []*pgratelimit.Limiter{l}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, base: srv.URL}

	_, page := b.get("/")
	contains(t, page, "overrides", "the same")
	_, page = b.get("/key?prefix=api&key=acme")
	contains(t, page, "None: the limiter's policy applies.", `data-testid="remaining">6<`)
	tok := token(t, page)
	post := func(path string, f map[string]string, want int) string {
		t.Helper()
		v := form("prefix", "api", "key", "acme", "csrf", tok)
		for k, x := range f {
			v.Set(k, x)
		}
		resp, body := b.post(path, v, nil)
		if resp.StatusCode != want {
			t.Fatalf("POST %s: %d, want %d\n%s", path, resp.StatusCode, want, body)
		}
		return body
	}
	post("/override", map[string]string{"capacity": "100", "refill": "10", "until": "720h", "note": "<b>plan</b> upgrade"}, http.StatusSeeOther)
	if r, err := l.Peek(ctx, "acme"); err != nil || r.Limit != 100 || r.Remaining != 96 {
		t.Errorf("after the override: %+v, %v", r, err)
	}
	_, page = b.get("/key?prefix=api&key=acme&done=override")
	contains(t, page, "Capacity 100, +10 a refill, until", "&lt;b&gt;plan&lt;/b&gt; upgrade", `data-testid="remaining">96<`, "Clear it")
	if body := post("/override", map[string]string{"capacity": "0", "refill": "1"}, http.StatusBadRequest); !strings.Contains(body, "capacity must be a whole number") {
		t.Errorf("capacity 0:\n%s", body)
	}
	if body := post("/override", map[string]string{"capacity": "5", "refill": "1", "until": "2001-01-01T00:00:00Z"}, http.StatusBadRequest); !strings.Contains(body, "is not after now") {
		t.Errorf("an until past:\n%s", body)
	}
	post("/clear-override", nil, http.StatusSeeOther)
	if r, err := l.Peek(ctx, "acme"); err != nil || r.Limit != 10 {
		t.Errorf("after the clear: %+v, %v", r, err)
	}

	// Another instance runs another policy on the prefix.
	other, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 20, Refill: 1, Interval: time.Second, Overrides: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Peek(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	_, page = b.get("/")
	contains(t, page, "2 recorded, 1 of them another: instances disagree")
	_, page = b.get("/policies")
	contains(t, page, `<td class="n">20</td>`, "<strong>another policy</strong>", "the same")
}

package ui

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// parsePages parses each page, a template of web/, with web/layout.html.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"keyURL":  keyURL,
		"keysURL": keysURL,
		"when":    when,
		"dur":     dur,
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"prefixes", "policies", "keys", "key", "error"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(webFiles, "web/layout.html", "web/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("pgratelimit/ui: parsing the page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// tokenKey is the request context's key of the browser's CSRF token.
type tokenKey struct{}

func withToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

// view is what every page shows: its title, the CSRF token of its forms
// (none in read-only mode), the prefixes for the search form, a message
// and the page's own data.
type view struct {
	Title    string
	CSRF     string
	ReadOnly bool
	Prefixes []string
	Prefix   string // the prefix of the page, if any: the search form's choice
	Done     string // what the last action did
	Error    string
	Data     any
}

// render writes page with status, or a plain error if the template fails.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, page string, v view) {
	v.ReadOnly = h.cfg.ReadOnly
	v.Prefixes = h.prefixes
	if tok, _ := r.Context().Value(tokenKey{}).(string); !v.ReadOnly {
		v.CSRF = tok
	}
	var b strings.Builder
	if err := h.pages[page].ExecuteTemplate(&b, "layout", v); err != nil {
		h.log.Error("pgratelimit ui: rendering a page", "page", page, "err", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail shows err on the error page, with the status it calls for.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, title string, err error) {
	status := statusOf(err)
	if status >= 500 {
		h.log.Error("pgratelimit ui: "+title, "err", err)
	}
	h.render(w, r, status, "error", view{Title: title, Error: err.Error()})
}

// statusOf is the HTTP status of an error of the library: 400 for a bad
// argument, 404 for what is not there, 503 for a lock not had in time, 500
// for the rest (the database's).
func statusOf(err error) int {
	switch {
	case errors.Is(err, pgratelimit.ErrInvalidArgument), errors.Is(err, pgratelimit.ErrGrantExpired),
		errors.Is(err, pgratelimit.ErrRequestMismatch):
		return http.StatusBadRequest
	case errors.Is(err, errUnknownPrefix), errors.Is(err, pgratelimit.ErrLeaseNotFound),
		errors.Is(err, pgratelimit.ErrLeaseExpired), errors.Is(err, events.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, pgratelimit.ErrLockTimeout):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// errUnknownPrefix is the error of a prefix no limiter or semaphore of the
// UI has.
var errUnknownPrefix = errors.New("no limiter or semaphore of this UI has the prefix")

// prefixRow is a row of the prefixes page: a prefix's limiter or
// semaphore (or both), its policy and its keys' counts.
type prefixRow struct {
	Prefix    string
	Policy    string
	Storage   string
	Features  []string
	Counts    admin.KeyCounts
	Near      int64 // the tokens at or below which a key counts as near its limit
	Semaphore bool
	Stored    string // how the policies the limiters recorded compare with this limiter's
	Differs   bool   // they do not all agree with it
	Error     string
}

// servePrefixes is the first page: every prefix with its policy and how
// many of its keys are near or at their limit.
func (h *handler) servePrefixes(w http.ResponseWriter, r *http.Request) {
	stored, err := admin.Policies(r.Context(), h.cfg.Pool)
	if err != nil {
		h.fail(w, r, "Prefixes", err)
		return
	}
	var rows []prefixRow
	for _, p := range h.prefixes {
		row := prefixRow{Prefix: p}
		storage := pgratelimit.Durable
		if l := h.limiters[p]; l != nil {
			c := l.Config()
			row.Policy, row.Features, storage = policyText(c), features(c), c.Storage
			row.Near = c.Capacity / 10
			row.Stored, row.Differs = storedText(c, stored)
		}
		if s := h.semaphores[p]; s != nil {
			c := s.Config()
			row.Semaphore, storage = true, c.Storage
			sem := fmt.Sprintf("at most %d at once, leases of %s", c.Max, dur(c.TTL))
			row.Policy = strings.TrimPrefix(row.Policy+"; "+sem, "; ")
		}
		row.Storage = storage.String()
		counts, err := admin.CountKeys(r.Context(), h.cfg.Pool, p, storage, row.Near)
		if err != nil {
			h.log.Error("pgratelimit ui: counting keys", "prefix", p, "err", err)
			row.Error = err.Error()
		}
		row.Counts = counts
		rows = append(rows, row)
	}
	h.render(w, r, http.StatusOK, "prefixes", view{Title: "Prefixes", Data: rows})
}

// storedText says how the policies recorded for c's prefix compare with
// c, and whether any differs.
func storedText(c pgratelimit.Config, stored []admin.Policy) (string, bool) {
	var n, same int
	for _, p := range stored {
		if p.Prefix == c.Prefix {
			n++
			if samePolicy(p, c) {
				same++
			}
		}
	}
	switch {
	case n == 0:
		return "none recorded yet", false
	case n == 1 && same == 1:
		return "the same", false
	case same == 0:
		return "another one: see the policies", true
	}
	return fmt.Sprintf("%d recorded, %d of them another: instances disagree (see the policies)", n, n-same), true
}

// samePolicy says whether the recorded policy p is c's.
func samePolicy(p admin.Policy, c pgratelimit.Config) bool {
	pc, err := p.Config()
	if err != nil {
		return false
	}
	loc := func(l *time.Location) string {
		if l == nil {
			return "UTC"
		}
		return l.String()
	}
	return pc.Capacity == c.Capacity && pc.Refill == c.Refill && pc.Interval == c.Interval && pc.Storage == c.Storage &&
		pc.Calendar.Every == c.Calendar.Every && (c.Calendar.Every == 0 || loc(pc.Calendar.Location) == loc(c.Calendar.Location)) &&
		pc.Calendar.Anchor.Equal(c.Calendar.Anchor) && pc.Grants == c.Grants && pc.Ledger == c.Ledger && pc.Overrides == c.Overrides
}

// policyRow is a row of the policies page: a recorded policy, whether its
// prefix has others, and how it compares with this UI's limiter.
type policyRow struct {
	admin.Policy
	Several bool   // its prefix has several policies recorded
	Here    string // "same", "another", or "" when this UI has no limiter of the prefix
}

// servePolicies lists the policies that limiters recorded (admin.Policies),
// by prefix, and says where instances disagree or differ from this UI's.
func (h *handler) servePolicies(w http.ResponseWriter, r *http.Request) {
	ps, err := admin.Policies(r.Context(), h.cfg.Pool)
	if err != nil {
		h.fail(w, r, "Policies", err)
		return
	}
	count := map[string]int{}
	for _, p := range ps {
		count[p.Prefix]++
	}
	rows := make([]policyRow, 0, len(ps))
	for _, p := range ps {
		row := policyRow{Policy: p, Several: count[p.Prefix] > 1}
		if l := h.limiters[p.Prefix]; l != nil {
			row.Here = "another"
			if samePolicy(p, l.Config()) {
				row.Here = "same"
			}
		}
		rows = append(rows, row)
	}
	h.render(w, r, http.StatusOK, "policies", view{Title: "Policies", Data: rows})
}

// policyText says a limiter's policy: "capacity 100, +10 every 1m0s".
func policyText(c pgratelimit.Config) string {
	every := "every " + dur(c.Interval)
	if c.Calendar != (pgratelimit.Calendar{}) {
		every = "each " + c.Calendar.Every.String()
		if c.Calendar.Location != nil {
			every += " (" + c.Calendar.Location.String() + ")"
		}
	}
	return fmt.Sprintf("capacity %d, +%d %s", c.Capacity, c.Refill, every)
}

// features lists what a limiter keeps besides its buckets.
func features(c pgratelimit.Config) []string {
	var fs []string
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Grants, "grants"}, {c.Ledger, "ledger"}, {c.Overrides, "overrides"}, {c.RequestIDRetention > 0, "request IDs"},
		{len(c.Alerts.UsedFractions)+len(c.Alerts.BalanceAtOrBelow) > 0 || c.Alerts.Exhausted, "alerts"}} {
		if f.on {
			fs = append(fs, f.name)
		}
	}
	return fs
}

// keysPage is the key search's results.
type keysPage struct {
	Match string
	Keys  []admin.Key
	Next  string // the next page's URL, if there may be one
}

// pageSize is how many keys, ledger entries or events a page shows.
const pageSize = 50

// serveKeys searches a prefix's keys by the start of the key.
func (h *handler) serveKeys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix, match, after := q.Get("prefix"), q.Get("match"), q.Get("after")
	storage, err := h.storage(prefix)
	if err != nil {
		h.fail(w, r, "Keys", err)
		return
	}
	keys, err := admin.Keys(r.Context(), h.cfg.Pool, admin.KeyFilter{Prefix: prefix, Storage: storage, Match: match, AfterKey: after, Limit: pageSize})
	if err != nil {
		h.fail(w, r, "Keys", err)
		return
	}
	p := keysPage{Match: match, Keys: keys}
	if len(keys) == pageSize {
		p.Next = keysURL(prefix, match, keys[len(keys)-1].Key)
	}
	h.render(w, r, http.StatusOK, "keys", view{Title: "Keys of " + prefix, Prefix: prefix, Data: p})
}

// storage is the storage of prefix's limiter or semaphore.
func (h *handler) storage(prefix string) (pgratelimit.Storage, error) {
	if l := h.limiters[prefix]; l != nil {
		return l.Config().Storage, nil
	}
	if s := h.semaphores[prefix]; s != nil {
		return s.Config().Storage, nil
	}
	return 0, fmt.Errorf("%w: %q", errUnknownPrefix, prefix)
}

// keyURL is the relative URL of a key's page.
func keyURL(prefix, key string) string {
	return "key?" + url.Values{"prefix": {prefix}, "key": {key}}.Encode()
}

// keysURL is the relative URL of a key search.
func keysURL(prefix, match, after string) string {
	v := url.Values{"prefix": {prefix}}
	if match != "" {
		v.Set("match", match)
	}
	if after != "" {
		v.Set("after", after)
	}
	return "keys?" + v.Encode()
}

// when shows a time in UTC, to the second: "-" for the zero time.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// dur shows a duration as a person reads it: to the millisecond below a
// second, to the tenth below a minute, to the second below a day, in days
// and hours above; "-" for none, "never" for pgratelimit.InfDuration.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d == pgratelimit.InfDuration:
		return "never"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 24*time.Hour:
		return d.Round(time.Second).String()
	}
	h := int64(d.Round(time.Hour) / time.Hour)
	return fmt.Sprintf("%dd%dh", h/24, h%24)
}

// atoi64 parses a form's positive integer field.
func atoi64(r *http.Request, field string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(r.PostForm.Get(field)), 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: %s must be a whole number of at least 1, got %q", pgratelimit.ErrInvalidArgument, field, r.PostForm.Get(field))
	}
	return n, nil
}

package ui

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/admin"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// keyPage is a key's page: what its limiter and its semaphore of the
// prefix say of it, and its alert events.
type keyPage struct {
	Prefix, Key string

	Limiter   bool
	Policy    string
	Features  []string
	Grants    bool // the limiter has grants: the page lists them and can grant
	Balance   pgratelimit.Result
	Row       *admin.Key // the stored row, nil when there is none
	GrantRows []pgratelimit.Grant

	Overrides bool            // the limiter has Config.Overrides: the page shows and sets the key's
	Override  *admin.Override // the key's override, nil when it has none

	Ledger     bool
	LedgerRows []pgratelimit.LedgerEntry // newest first
	Older      string                    // the URL of the older entries, if any
	Paged      bool                      // not the newest entries

	RequestID string
	Record    *admin.Request
	RecordErr string

	Semaphore bool
	Max       int64
	Leases    []pgratelimit.Lease

	Events []events.Event // newest first
}

// serveKey is a key's page.
func (h *handler) serveKey(w http.ResponseWriter, r *http.Request) {
	h.renderKey(w, r, http.StatusOK, "")
}

// renderKey shows the key of the request's prefix and key parameters (a
// query's or a form's), with an action's error, if any.
func (h *handler) renderKey(w http.ResponseWriter, r *http.Request, status int, actionErr string) {
	prefix, key := r.FormValue("prefix"), r.FormValue("key")
	p, err := h.keyPage(r.Context(), prefix, key, r.URL.Query())
	if err != nil {
		h.fail(w, r, "Key "+strconv.Quote(key), err)
		return
	}
	h.render(w, r, status, "key", view{Title: key, Prefix: prefix, Data: p, Error: actionErr, Done: doneText(r.URL.Query().Get("done"))})
}

// doneText says what an action did, after its redirect to the key's page.
func doneText(action string) string {
	switch action {
	case "grant":
		return "Granted."
	case "refund":
		return "Refunded."
	case "reset":
		return "The bucket was reset: it is full again."
	case "release":
		return "The lease was released."
	case "redeliver":
		return "The event is due again: a consumer delivers it next."
	case "override":
		return "The override is set: every check from now on decides with it."
	case "clear-override":
		return "The override is cleared: the limiter's policy applies again."
	}
	return ""
}

// keyPage reads what the page of prefix's key shows.
func (h *handler) keyPage(ctx context.Context, prefix, key string, q map[string][]string) (*keyPage, error) {
	l, s := h.limiters[prefix], h.semaphores[prefix]
	if l == nil && s == nil {
		return nil, errors.Join(errUnknownPrefix, errors.New(strconv.Quote(prefix)))
	}
	p := &keyPage{Prefix: prefix, Key: key}
	if l != nil {
		if err := h.limiterPart(ctx, p, l, q); err != nil {
			return nil, err
		}
	}
	if s != nil {
		p.Semaphore, p.Max = true, s.Config().Max
		ls, err := s.Leases(ctx, key)
		if err != nil {
			return nil, err
		}
		p.Leases = ls
	}
	evs, err := events.List(ctx, h.cfg.Pool, events.Filter{Prefix: prefix, Key: key, Limit: pageSize})
	if err != nil {
		return nil, err
	}
	slices.Reverse(evs)
	p.Events = evs
	return p, nil
}

// limiterPart reads what the key's limiter says of it: its balance, its
// row, its grants, its ledger (a page of it, before the ID of the query's
// "before") and the record of the query's "request_id".
func (h *handler) limiterPart(ctx context.Context, p *keyPage, l *pgratelimit.Limiter, q map[string][]string) error {
	c := l.Config()
	p.Limiter, p.Policy, p.Features, p.Grants, p.Ledger = true, policyText(c), features(c), c.Grants, c.Ledger
	var err error
	if p.Balance, err = l.Peek(ctx, p.Key); err != nil {
		return err
	}
	rows, err := admin.Keys(ctx, h.cfg.Pool, admin.KeyFilter{Prefix: p.Prefix, Storage: c.Storage, Match: p.Key, Limit: 1})
	if err != nil {
		return err
	}
	if len(rows) == 1 && rows[0].Key == p.Key {
		p.Row = &rows[0]
	}
	if c.Grants {
		if p.GrantRows, err = l.Grants(ctx, p.Key); err != nil {
			return err
		}
	}
	if p.Overrides = c.Overrides; c.Overrides {
		os, err := admin.Overrides(ctx, h.cfg.Pool, admin.OverrideFilter{Prefix: p.Prefix, Key: p.Key, Limit: 1})
		if err != nil {
			return err
		}
		if len(os) == 1 && os[0].Key == p.Key {
			p.Override = &os[0]
		}
	}
	if c.Ledger {
		if err := ledgerPage(ctx, p, l, first(q, "before")); err != nil {
			return err
		}
	}
	if p.RequestID = first(q, "request_id"); p.RequestID != "" {
		rec, err := admin.LookupRequest(ctx, h.cfg.Pool, p.Prefix, p.Key, p.RequestID)
		switch {
		case err == nil:
			p.Record = &rec
		case errors.Is(err, pgratelimit.ErrUnknownRequest), errors.Is(err, pgratelimit.ErrInvalidArgument):
			p.RecordErr = err.Error()
		default:
			return err
		}
	}
	return nil
}

// ledgerPage reads the key's ledger and keeps a page of it, newest first:
// the entries before the ID before ("": the newest).
func ledgerPage(ctx context.Context, p *keyPage, l *pgratelimit.Limiter, before string) error {
	es, err := l.Ledger(ctx, p.Key, time.Time{})
	if err != nil {
		return err
	}
	slices.SortFunc(es, func(a, b pgratelimit.LedgerEntry) int { return cmp.Compare(b.ID, a.ID) })
	if id, err := strconv.ParseInt(before, 10, 64); err == nil {
		p.Paged = true
		es = slices.DeleteFunc(es, func(e pgratelimit.LedgerEntry) bool { return e.ID >= id })
	}
	if len(es) > pageSize {
		es = es[:pageSize]
		p.Older = keyURL(p.Prefix, p.Key) + "&before=" + strconv.FormatInt(es[len(es)-1].ID, 10)
	}
	p.LedgerRows = es
	return nil
}

// first is a query's first value of name, or "".
func first(q map[string][]string, name string) string {
	if vs := q[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

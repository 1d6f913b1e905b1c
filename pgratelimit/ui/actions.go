package ui

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/events"
)

// action is a POST form of a key's page: its path and what it does with
// the form (prefix, key and its own fields), through the library. It
// returns what to log of it.
type action struct {
	name string
	run  func(h *handler, ctx context.Context, r *http.Request, prefix, key string) ([]any, error)
}

// actions are the UI's actions.
func actions() []action {
	return []action{
		{"grant", (*handler).grant},
		{"refund", (*handler).refund},
		{"reset", (*handler).reset},
		{"release", (*handler).release},
		{"redeliver", (*handler).redeliver},
		{"override", (*handler).setOverride},
		{"clear-override", (*handler).clearOverride},
	}
}

// act runs a, logs it and sends the browser back to the key's page (303,
// so that a reload does not repeat it); when it fails, it shows the key's
// page with the error instead.
func (h *handler) act(w http.ResponseWriter, r *http.Request, a action) {
	prefix, key := r.PostForm.Get("prefix"), r.PostForm.Get("key")
	attrs, err := a.run(h, r.Context(), r, prefix, key)
	if err != nil {
		status := statusOf(err)
		level := slog.LevelWarn
		if status >= 500 {
			level = slog.LevelError
		}
		h.log.Log(r.Context(), level, "pgratelimit ui: "+a.name+" failed", "prefix", prefix, "key", key, "err", err)
		h.renderKey(w, r, status, err.Error())
		return
	}
	h.log.Info("pgratelimit ui: "+a.name, append([]any{"prefix", prefix, "key", key}, attrs...)...)
	// A relative Location (http.Redirect would make it absolute from the
	// path without Config.Prefix): the browser resolves it beside this
	// action's path.
	w.Header().Set("Location", keyURL(prefix, key)+"&done="+a.name)
	w.WriteHeader(http.StatusSeeOther)
}

func (h *handler) limiter(prefix string) (*pgratelimit.Limiter, error) {
	if l := h.limiters[prefix]; l != nil {
		return l, nil
	}
	return nil, fmt.Errorf("%w: no limiter of prefix %q", errUnknownPrefix, prefix)
}

func (h *handler) semaphore(prefix string) (*pgratelimit.Semaphore, error) {
	if s := h.semaphores[prefix]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: no semaphore of prefix %q", errUnknownPrefix, prefix)
}

// grant grants the form's amount, expiring at the form's expires (a time,
// RFC 3339, or a duration from now; empty: never).
func (h *handler) grant(ctx context.Context, r *http.Request, prefix, key string) ([]any, error) {
	l, err := h.limiter(prefix)
	if err != nil {
		return nil, err
	}
	amount, err := atoi64(r, "amount")
	if err != nil {
		return nil, err
	}
	expires, err := timeField(r, "expires")
	if err != nil {
		return nil, err
	}
	g, err := l.Grant(ctx, key, amount, expires)
	if err != nil {
		return nil, err
	}
	return []any{"amount", amount, "grant", g.ID, "expires", expires}, nil
}

// refund refunds the form's amount.
func (h *handler) refund(ctx context.Context, r *http.Request, prefix, key string) ([]any, error) {
	l, err := h.limiter(prefix)
	if err != nil {
		return nil, err
	}
	amount, err := atoi64(r, "amount")
	if err != nil {
		return nil, err
	}
	if _, err := l.Refund(ctx, key, amount); err != nil {
		return nil, err
	}
	return []any{"amount", amount}, nil
}

// reset makes the key's bucket full again.
func (h *handler) reset(ctx context.Context, _ *http.Request, prefix, key string) ([]any, error) {
	l, err := h.limiter(prefix)
	if err != nil {
		return nil, err
	}
	return nil, l.Reset(ctx, key)
}

// release releases the form's lease.
func (h *handler) release(ctx context.Context, r *http.Request, prefix, key string) ([]any, error) {
	s, err := h.semaphore(prefix)
	if err != nil {
		return nil, err
	}
	id := r.PostForm.Get("lease")
	return []any{"lease", id}, s.Release(ctx, key, id)
}

// redeliver makes the form's event due again.
func (h *handler) redeliver(ctx context.Context, r *http.Request, _, _ string) ([]any, error) {
	id, err := strconv.ParseInt(r.PostForm.Get("event"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: event must be an event's ID, got %q", pgratelimit.ErrInvalidArgument, r.PostForm.Get("event"))
	}
	return []any{"event", id}, events.Redeliver(ctx, h.cfg.Pool, id)
}

// timeField parses a form's time: empty (the zero time), a duration from
// now ("720h") or an RFC 3339 time.
func timeField(r *http.Request, field string) (time.Time, error) {
	s := strings.TrimSpace(r.PostForm.Get(field))
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s must be empty (never), a time such as 2027-01-31T00:00:00Z or a duration such as 720h, got %q",
			pgratelimit.ErrInvalidArgument, field, s)
	}
	return t, nil
}

// setOverride sets the key's override: the form's capacity, refill, until
// (as timeField reads it) and note.
func (h *handler) setOverride(ctx context.Context, r *http.Request, prefix, key string) ([]any, error) {
	l, err := h.limiter(prefix)
	if err != nil {
		return nil, err
	}
	capacity, err := atoi64(r, "capacity")
	if err != nil {
		return nil, err
	}
	refill, err := atoi64(r, "refill")
	if err != nil {
		return nil, err
	}
	until, err := timeField(r, "until")
	if err != nil {
		return nil, err
	}
	o := pgratelimit.Override{Capacity: capacity, Refill: refill, Until: until, Note: r.PostForm.Get("note")}
	if _, err := l.SetOverride(ctx, key, o); err != nil {
		return nil, err
	}
	return []any{"capacity", capacity, "refill", refill, "until", until, "note", o.Note}, nil
}

// clearOverride clears the key's override.
func (h *handler) clearOverride(ctx context.Context, _ *http.Request, prefix, key string) ([]any, error) {
	l, err := h.limiter(prefix)
	if err != nil {
		return nil, err
	}
	_, err = l.ClearOverride(ctx, key)
	return nil, err
}

package demo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// servePolicy applies a new policy from the form fields capacity, refill,
// interval (a Go duration) and storage.
func (a *app) servePolicy(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	bad := func(format string, args ...any) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf(format, args...)})
	}
	capacity, err := strconv.ParseInt(r.FormValue("capacity"), 10, 64)
	if err != nil || capacity < 1 {
		bad("Capacity must be a whole number of at least 1, got %q", r.FormValue("capacity"))
		return
	}
	refill, err := strconv.ParseInt(r.FormValue("refill"), 10, 64)
	if err != nil || refill < 1 {
		bad("Refill must be a whole number of at least 1, got %q", r.FormValue("refill"))
		return
	}
	interval, err := time.ParseDuration(r.FormValue("interval"))
	if err != nil || interval <= 0 {
		bad("Interval must be a positive duration such as 1s, 500ms or 1m, got %q", r.FormValue("interval"))
		return
	}
	cfg := pgratelimit.Config{Capacity: capacity, Refill: refill, Interval: interval}
	switch r.FormValue("storage") {
	case "", "ephemeral":
		cfg.Storage = pgratelimit.Ephemeral
	case "durable":
		cfg.Storage = pgratelimit.Durable
	default:
		bad("Storage must be durable or ephemeral, got %q", r.FormValue("storage"))
		return
	}
	p, err := a.apply(r.Context(), cfg, key)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, pgratelimit.ErrInvalidConfig) {
			status = http.StatusBadRequest
		}
		writeJSON(w, status, map[string]string{"error": clierr.Text(err)})
		return
	}
	writeJSON(w, http.StatusOK, describePolicy(p))
}

// serveReset makes the client's buckets full again.
func (a *app) serveReset(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	p := a.cur.Load()
	err := p.l.Reset(r.Context(), key)
	if err == nil {
		err = p.minute.Reset(r.Context(), key)
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": p.cfg.Capacity})
}

// rollbackJSON is the rollback scenario's account of what happened.
type rollbackJSON struct {
	Cost     int64  `json:"cost"`
	Before   int64  `json:"before"`
	Allowed  bool   `json:"allowed"`
	InTx     int64  `json:"in_tx"` // tokens left inside the transaction, after the charge
	Failure  string `json:"failure"`
	After    int64  `json:"after"`
	Capacity int64  `json:"capacity"`
}

// serveRollback charges ?cost= credits inside a transaction (Limiter.In),
// then runs work in the same transaction that fails, and rolls back:
// nothing is spent.
func (a *app) serveRollback(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	p := a.cur.Load()
	fail := func(err error) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
	}
	out := rollbackJSON{Cost: costParam(r), Capacity: p.cfg.Capacity}
	if out.Cost < 1 || out.Cost > p.cfg.Capacity {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("cost must be between 1 and the capacity, %d", p.cfg.Capacity)})
		return
	}
	before, err := p.l.Peek(ctx, key)
	if err != nil {
		fail(err)
		return
	}
	out.Before = before.Remaining
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		fail(err)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back below; a second rollback is harmless
	res, err := p.l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, key, out.Cost)
	if err != nil {
		fail(err)
		return
	}
	out.Allowed, out.InTx = res.Allowed, res.Remaining
	// The work the credits paid for fails (here: a query that divides by
	// zero), so the transaction rolls back, and the charge with it.
	if _, err := tx.Exec(ctx, "SELECT 1/0 AS the_report"); err != nil {
		out.Failure = err.Error()
	}
	if err := tx.Rollback(ctx); err != nil {
		fail(err)
		return
	}
	after, err := p.l.Peek(ctx, key)
	if err != nil {
		fail(err)
		return
	}
	out.After = after.Remaining
	writeJSON(w, http.StatusOK, out)
}

package demo

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// servePolicy applies a new policy from the form fields capacity, refill,
// interval (a Go duration) and storage; the library checks it (New).
func (a *app) servePolicy(w http.ResponseWriter, r *http.Request, key string) error {
	capacity, err := strconv.ParseInt(r.FormValue("capacity"), 10, 64)
	if err != nil {
		return badf("Capacity must be a whole number of at least 1, got %q", r.FormValue("capacity"))
	}
	refill, err := strconv.ParseInt(r.FormValue("refill"), 10, 64)
	if err != nil {
		return badf("Refill must be a whole number of at least 1, got %q", r.FormValue("refill"))
	}
	interval, err := time.ParseDuration(r.FormValue("interval"))
	if err != nil {
		return badf("Interval must be a positive duration such as 1s, 500ms or 1m, got %q", r.FormValue("interval"))
	}
	cfg := pgratelimit.Config{Capacity: capacity, Refill: refill, Interval: interval, Storage: pgratelimit.Ephemeral}
	switch r.FormValue("storage") {
	case "", "ephemeral":
	case "durable":
		cfg.Storage = pgratelimit.Durable
	default:
		return badf("Storage must be durable or ephemeral, got %q", r.FormValue("storage"))
	}
	p, err := a.apply(r.Context(), cfg, key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, describePolicy(p))
	return nil
}

// serveReset makes the client's buckets full again.
func (a *app) serveReset(w http.ResponseWriter, r *http.Request, key string) error {
	p := a.cur.Load()
	if err := errors.Join(p.l.Reset(r.Context(), key), p.minute.Reset(r.Context(), key)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": p.l.Config().Capacity})
	return nil
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
// nothing is spent. (A cost the library refuses is a 400.)
func (a *app) serveRollback(w http.ResponseWriter, r *http.Request, key string) error {
	ctx := r.Context()
	p := a.cur.Load()
	out := rollbackJSON{Cost: costParam(r), Capacity: p.l.Config().Capacity}
	before, err := p.l.Peek(ctx, key)
	if err != nil {
		return err
	}
	out.Before = before.Remaining
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back below; a second rollback is harmless
	res, err := p.l.In(pgratelimit.PgxTx(tx)).AllowN(ctx, key, out.Cost)
	if err != nil {
		return err
	}
	out.Allowed, out.InTx = res.Allowed, res.Remaining
	// The work the credits paid for fails (here: a query that divides by
	// zero), so the transaction rolls back, and the charge with it.
	if _, err := tx.Exec(ctx, "SELECT 1/0 AS the_report"); err != nil {
		out.Failure = err.Error()
	}
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	after, err := p.l.Peek(ctx, key)
	if err != nil {
		return err
	}
	out.After = after.Remaining
	writeJSON(w, http.StatusOK, out)
	return nil
}

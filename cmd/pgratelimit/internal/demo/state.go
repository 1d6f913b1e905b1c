package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

type bucketJSON struct {
	Tokens   int64 `json:"tokens"`
	Capacity int64 `json:"capacity"`
	// NextRefillMS is the time to the next refill on the bucket's grid, 0
	// when the bucket is full; FullInMS the time until it is full.
	NextRefillMS int64 `json:"next_refill_ms"`
	FullInMS     int64 `json:"full_in_ms"`
}

type policyJSON struct {
	Gen        int    `json:"gen"`
	Prefix     string `json:"prefix"`
	Capacity   int64  `json:"capacity"`
	Refill     int64  `json:"refill"`
	Interval   string `json:"interval"`
	IntervalMS int64  `json:"interval_ms"`
	Storage    string `json:"storage"`
	Header     string `json:"header"` // RateLimit-Policy
	Minute     string `json:"minute"` // the per-minute limit of the two-limits scenario
}

type stateJSON struct {
	TimeMS  int64       `json:"time_ms"`
	Key     string      `json:"key"`
	Policy  policyJSON  `json:"policy"`
	Bucket  bucketJSON  `json:"bucket"`
	Minute  bucketJSON  `json:"minute"`
	Credits creditsJSON `json:"credits"`
	Jobs    jobsJSON    `json:"jobs"`
	Error   string      `json:"error,omitempty"`
}

func describePolicy(p *policy) policyJSON {
	c, m := p.l.Config(), p.minute.Config()
	// The middleware's RateLimit-Policy, its window from the one place that
	// computes it (the bucket's fill time: full or not, it is the same).
	full := pgratelimit.MultiResult{Allowed: true, Results: []pgratelimit.Result{{Limit: c.Capacity, Remaining: c.Capacity}}}
	return policyJSON{
		Gen: p.gen, Prefix: c.Prefix, Capacity: c.Capacity, Refill: c.Refill,
		Interval: c.Interval.String(), IntervalMS: c.Interval.Milliseconds(), Storage: c.Storage.String(),
		Header: middleware.FieldsFor([]*pgratelimit.Limiter{p.l}, full).Policy,
		Minute: fmt.Sprintf("%d per minute", m.Capacity),
	}
}

// bucketOf is a peeked bucket, with the time to its next refill worked out
// from ResetAfter: full after some more refills, an interval apart.
func bucketOf(r pgratelimit.Result, cfg pgratelimit.Config) bucketJSON {
	b := bucketJSON{Tokens: r.Remaining, Capacity: r.Limit, FullInMS: r.ResetAfter.Milliseconds()}
	if r.Remaining < r.Limit && r.ResetAfter > 0 {
		next := r.ResetAfter % cfg.Interval // (the refills after the next are an interval apart)
		if next == 0 {
			next = cfg.Interval
		}
		b.NextRefillMS = max(next.Milliseconds(), 1)
	}
	return b
}

// state peeks at key's buckets (taking nothing), reads its credits and its
// jobs' leases.
func (a *app) state(ctx context.Context, key string) stateJSON {
	p := a.cur.Load()
	st := stateJSON{TimeMS: time.Now().UnixMilli(), Key: key, Policy: describePolicy(p)}
	var errs []error
	if r, err := p.l.Peek(ctx, key); err != nil {
		errs = append(errs, err)
	} else {
		st.Bucket = bucketOf(r, p.l.Config())
	}
	if r, err := p.minute.Peek(ctx, key); err != nil {
		errs = append(errs, err)
	} else {
		st.Minute = bucketOf(r, p.minute.Config())
	}
	if c, err := a.creditsState(ctx, key); err != nil {
		errs = append(errs, err)
	} else {
		st.Credits = c
	}
	if j, err := a.jobs.state(ctx, key); err != nil {
		errs = append(errs, err)
	} else {
		st.Jobs = j
	}
	if err := errors.Join(errs...); err != nil {
		st.Error = clierr.Text(err)
	}
	return st
}

// keyed serves h with the client's key (KeyByIP; none is a 400). An error
// h returns is the answer: a 400 for bad input (badRequest, or a policy or
// an argument the library refuses), else a 503, in the library's words.
func (a *app) keyed(h func(w http.ResponseWriter, r *http.Request, key string) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := a.key(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		var bad badRequest
		switch err := h(w, r, key); {
		case err == nil:
		case errors.As(err, &bad) || errors.Is(err, pgratelimit.ErrInvalidConfig) || errors.Is(err, pgratelimit.ErrInvalidArgument):
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": clierr.Text(err)})
		default:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		}
	})
}

// badRequest is an error of the request's input.
type badRequest struct{ error }

func badf(format string, args ...any) error { return badRequest{fmt.Errorf(format, args...)} }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeMessage answers an action with status and msg, what it did, in
// words; the cards' state comes from the state and its event stream.
func writeMessage(w http.ResponseWriter, status int, msg string) error {
	writeJSON(w, status, map[string]string{"message": msg})
	return nil
}

func (a *app) serveState(w http.ResponseWriter, r *http.Request, key string) error {
	writeJSON(w, http.StatusOK, a.state(r.Context(), key))
	return nil
}

// eventsEvery is how often the event stream sends the bucket's state.
const eventsEvery = 250 * time.Millisecond

// serveEvents streams the state of the client's bucket as Server-Sent
// Events, every eventsEvery, until the client goes or the server stops.
func (a *app) serveEvents(w http.ResponseWriter, r *http.Request, key string) error {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(eventsEvery)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(r.Context(), max(a.timeout, eventsEvery))
		st := a.state(ctx, key)
		cancel()
		b, _ := json.Marshal(st)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-a.done:
			return nil
		case <-tick.C:
		}
	}
}

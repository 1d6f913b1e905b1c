package demo

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/internal/middleware"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// creditsPolicy is the credits scenario's limiter: 100 credits a month, the
// quota renewed whole (Refill == Capacity) on the 1st at midnight UTC,
// grants spent after it, and usage alerts (creditsAlerts).
func creditsPolicy() pgratelimit.Config {
	return pgratelimit.Config{Prefix: creditsPrefix, Capacity: 100, Refill: 100,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Storage: pgratelimit.Durable, Grants: true,
		Ledger: true, Overrides: true, Alerts: creditsAlerts}
}

// creditsPeriod says when the credits quota renews, for the page.
const creditsPeriod = "on the 1st of each month (UTC)"

// creditsJSON is the credits scenario's state: the quota (the bucket) and
// the granted balance beside it. Each grant, the ledger and the usage
// alerts are on the key's page of the operator UI, which the card links to.
type creditsJSON struct {
	Prefix   string `json:"prefix"`
	Period   string `json:"period"`
	Quota    int64  `json:"quota"`
	Capacity int64  `json:"capacity"`
	// RenewsInMS is the time until the quota is renewed (full again), 0
	// when it is full.
	RenewsInMS int64 `json:"renews_in_ms"`
	Granted    int64 `json:"granted"`
}

// creditsState peeks at key's quota and grants, taking nothing.
func (a *app) creditsState(ctx context.Context, key string) (creditsJSON, error) {
	r, err := a.credits.Load().Peek(ctx, key)
	if err != nil {
		return creditsJSON{}, err
	}
	c := creditsJSON{Prefix: creditsPrefix, Period: creditsPeriod, Quota: r.Remaining, Capacity: r.Limit, Granted: r.Granted}
	if r.Remaining < r.Limit {
		c.RenewsInMS = max(r.ResetAfter.Milliseconds(), 1)
	}
	return c, nil
}

// resetCredits gives key a full quota, no grants and no alerts, so that the
// card can be played again. The library has no call that revokes grants
// (they are credits someone paid for or was given) and keeps a key's alert
// state and events (Reset does not re-arm a line: it fires once per
// period), so the demo deletes its own rows of those tables; and since a
// limiter remembers the lines it saw fire, it makes a new one.
func (a *app) resetCredits(ctx context.Context, key string) error {
	if err := a.credits.Load().Reset(ctx, key); err != nil {
		return err
	}
	for _, table := range []string{sqlgen.GrantsTable, sqlgen.AlertStateTable, sqlgen.EventsTable} {
		del := `DELETE FROM ` + pgx.Identifier{table}.Sanitize() + ` WHERE prefix = $1 AND key = $2`
		if _, err := a.pool.Exec(ctx, del, creditsPrefix, key); err != nil {
			return fmt.Errorf("delete the rows of %q in %s: %w", key, table, err)
		}
	}
	return a.newCredits()
}

// chargeJSON is the answer to a charge: where its credits came from and
// what is left, or why it was denied.
type chargeJSON struct {
	Allowed    bool   `json:"allowed"`
	Cost       int64  `json:"cost"`
	FromQuota  int64  `json:"from_quota"`
	FromGrants int64  `json:"from_grants"`
	Quota      int64  `json:"quota"`
	Capacity   int64  `json:"capacity"`
	Granted    int64  `json:"granted"`
	Message    string `json:"message"`
}

// serveCharge charges ?cost= credits (AllowAll with one charge, as the
// middleware does, and the middleware's RateLimit headers): from the quota
// first, the rest from grants. A denied charge is a 429 with Retry-After
// and a message that says why.
func (a *app) serveCharge(w http.ResponseWriter, r *http.Request, key string) error {
	cost := costParam(r)
	if cost < 1 {
		return badf("cost must be a whole number of at least 1, got %q", r.URL.Query().Get("cost"))
	}
	l := a.credits.Load()
	m, err := pgratelimit.AllowAll(r.Context(), l.Charge(key, cost))
	if err != nil {
		return err
	}
	res := m.Results[0]
	out := chargeJSON{Allowed: m.Allowed, Cost: cost, Quota: res.Remaining, Capacity: res.Limit, Granted: res.Granted}
	f := middleware.FieldsFor([]*pgratelimit.Limiter{l}, m)
	w.Header().Set("RateLimit-Policy", f.Policy)
	w.Header().Set("RateLimit", f.RateLimit)
	status := http.StatusOK
	switch {
	case m.Allowed && res.FromGrants == 0:
		out.FromQuota = cost
		out.Message = fmt.Sprintf("Charged %d from the monthly quota: %d of %d left, %d granted.", cost, res.Remaining, res.Limit, res.Granted)
	case m.Allowed:
		out.FromGrants, out.FromQuota = res.FromGrants, cost-res.FromGrants
		out.Message = fmt.Sprintf("Charged %d: %d from the monthly quota (%d of %d left), %d from grants (%d left).",
			cost, out.FromQuota, res.Remaining, res.Limit, out.FromGrants, res.Granted)
	default:
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", f.RetryAfter)
		out.Message = fmt.Sprintf("Denied: a charge of %d is more than the %d left of the monthly quota and the %d granted; nothing taken. ",
			cost, res.Remaining, res.Granted)
		if m.RetryAfter == pgratelimit.InfDuration {
			out.Message += fmt.Sprintf("Even a full quota (%d) would not cover it: grant credits.", res.Limit)
		} else {
			out.Message += fmt.Sprintf("The quota renews in %s; or grant credits.", human.Duration(m.RetryAfter))
		}
	}
	writeJSON(w, status, out)
	return nil
}

// serveGrant grants ?amount= credits to the client, expiring after
// ?expires_in= (a Go duration; never without one).
func (a *app) serveGrant(w http.ResponseWriter, r *http.Request, key string) error {
	amount, err := strconv.ParseInt(r.FormValue("amount"), 10, 64)
	if err != nil {
		return badf("amount must be a whole number of at least 1, got %q", r.FormValue("amount"))
	}
	var expiresAt time.Time
	expires := "never expires"
	if s := r.FormValue("expires_in"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return badf("expires_in must be a positive duration such as 1h or 168h, got %q", s)
		}
		expiresAt, expires = time.Now().Add(d), "expires in "+human.Duration(d)
	}
	if _, err := a.credits.Load().Grant(r.Context(), key, amount, expiresAt); err != nil {
		return err
	}
	return a.writeCredits(w, r, key, func(c creditsJSON) string {
		return fmt.Sprintf("Granted %d credits (%s): %d granted in all, beside the quota's %d of %d.", amount, expires, c.Granted, c.Quota, c.Capacity)
	})
}

// serveCreditsReset gives the client a full quota and no grants.
func (a *app) serveCreditsReset(w http.ResponseWriter, r *http.Request, key string) error {
	if err := a.resetCredits(r.Context(), key); err != nil {
		return err
	}
	return a.writeCredits(w, r, key, func(c creditsJSON) string {
		return fmt.Sprintf("Started over: a full quota of %d, no grants.", c.Capacity)
	})
}

// writeCredits answers with what message makes of the credits card's
// state.
func (a *app) writeCredits(w http.ResponseWriter, r *http.Request, key string, message func(creditsJSON) string) error {
	c, err := a.creditsState(r.Context(), key)
	if err != nil {
		return err
	}
	return writeMessage(w, http.StatusOK, message(c))
}

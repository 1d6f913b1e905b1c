package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// The page: HTML, CSS and a small hand-written script, embedded so the demo
// works offline, with no build step.
//
//go:embed web
var webFiles embed.FS

// demoPrefix is the demo limiter's Config.Prefix: the policy's name in the
// RateLimit headers. minutePrefix is the per-minute limit of the two-limits
// scenario, creditsPrefix the credits scenario's quota and grants.
const (
	demoPrefix    = "demo"
	minutePrefix  = "demo-per-minute"
	creditsPrefix = "demo-credits"
)

// demoPolicy is the demo's first policy: burst 5, then 1 request per second.
var demoPolicy = pgratelimit.Config{Prefix: demoPrefix, Capacity: 5, Refill: 1, Interval: time.Second, Storage: pgratelimit.Ephemeral}

// policy is the limiter the page's requests go through, replaced whole when
// the page applies a new one.
type policy struct {
	gen    int
	cfg    pgratelimit.Config
	l      *pgratelimit.Limiter
	minute *pgratelimit.Limiter // the two-limits scenario's per-minute limit
}

// demoApp serves the page, the rate-limited endpoints behind the real
// middleware, the bucket's live state and the scenarios.
type demoApp struct {
	pool    *pgxpool.Pool
	credits *pgratelimit.Limiter // the credits scenario's: a monthly quota and grants
	counts  checkCounter
	mp      *sdkmetric.MeterProvider
	log     *slog.Logger
	timeout time.Duration // each request's database work; 0: none
	key     httplimit.KeyFunc

	mu  sync.Mutex // serializes applies
	cur atomic.Pointer[policy]

	done     chan struct{} // closed when the server shuts down: ends event streams
	doneOnce sync.Once
}

// checkCounter reads how many checks the demo's limiters decided, by result.
type checkCounter interface {
	counts(ctx context.Context) (checkCounts, error)
}

type checkCounts struct {
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
}

// otelCounter reads the library's pgratelimit.checks counter through an
// OpenTelemetry SDK ManualReader: the numbers an app's metrics would show.
type otelCounter struct {
	reader *sdkmetric.ManualReader
	mu     sync.Mutex
}

func (o *otelCounter) counts(ctx context.Context) (checkCounts, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(ctx, &rm); err != nil {
		return checkCounts{}, err
	}
	var c checkCounts
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "pgratelimit.checks" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				result, _ := dp.Attributes.Value("pgratelimit.result")
				switch result.AsString() {
				case "allowed":
					c.Allowed += dp.Value
				case "denied":
					c.Denied += dp.Value
				case "error":
					c.Errors += dp.Value
				}
			}
		}
	}
	return c, nil
}

func newDemoApp(pool *pgxpool.Pool, log *slog.Logger, timeout time.Duration) (*demoApp, error) {
	reader := sdkmetric.NewManualReader()
	a := &demoApp{
		pool:    pool,
		counts:  &otelCounter{reader: reader},
		mp:      sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		log:     log,
		timeout: timeout,
		key:     httplimit.KeyByIP(httplimit.IPKeyConfig{}),
		done:    make(chan struct{}),
	}
	cfg := creditsPolicy
	cfg.MeterProvider = a.mp
	credits, err := pgratelimit.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	a.credits = credits
	return a, nil
}

// apply makes cfg the page's policy: a new limiter, and a fresh (full)
// bucket for key, when not empty.
func (a *demoApp) apply(ctx context.Context, cfg pgratelimit.Config, key string) (*policy, error) {
	cfg.Prefix = demoPrefix
	cfg.MeterProvider = a.mp
	l, err := pgratelimit.New(a.pool, cfg)
	if err != nil {
		return nil, err
	}
	// The per-minute limit of the two-limits scenario: twice the burst,
	// refilled whole every minute.
	mcfg := pgratelimit.Config{Prefix: minutePrefix, Capacity: 2 * cfg.Capacity, Refill: 2 * cfg.Capacity, Interval: time.Minute,
		Storage: cfg.Storage, MeterProvider: a.mp}
	if mcfg.Capacity <= 0 { // overflowed
		mcfg.Capacity, mcfg.Refill = cfg.Capacity, cfg.Capacity
	}
	minute, err := pgratelimit.New(a.pool, mcfg)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &policy{cfg: cfg, l: l, minute: minute}
	if old := a.cur.Load(); old != nil {
		p.gen = old.gen + 1
	}
	if key != "" {
		if err := l.Reset(ctx, key); err != nil {
			return nil, err
		}
		if err := minute.Reset(ctx, key); err != nil {
			return nil, err
		}
	}
	a.cur.Store(p)
	return p, nil
}

func (a *demoApp) shutdown() { a.doneOnce.Do(func() { close(a.done) }) }

// handler is the demo's whole HTTP surface.
func (a *demoApp) handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFiles, "web")
	mux.Handle("GET /", http.FileServerFS(static))

	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from behind the rate limiter")
	})
	opts := func(pick func(p *policy) []*pgratelimit.Limiter) httplimit.Options {
		return httplimit.Options{
			KeyFunc: a.key,
			Cost:    costParam,
			Logger:  a.log,
			Limiters: func(*http.Request, string) ([]*pgratelimit.Limiter, error) {
				return pick(a.cur.Load()), nil
			},
		}
	}
	one := httplimit.MiddlewareAll(nil, opts(func(p *policy) []*pgratelimit.Limiter { return []*pgratelimit.Limiter{p.l} }))
	two := httplimit.MiddlewareAll(nil, opts(func(p *policy) []*pgratelimit.Limiter { return []*pgratelimit.Limiter{p.l, p.minute} }))
	mux.Handle("GET /api/limited", a.bounded(one(hello)))
	mux.Handle("GET /api/two-limits", a.bounded(two(hello)))

	mux.Handle("GET /api/state", a.bounded(http.HandlerFunc(a.serveState)))
	mux.HandleFunc("GET /api/events", a.serveEvents)
	mux.Handle("POST /api/policy", a.bounded(http.HandlerFunc(a.servePolicy)))
	mux.Handle("POST /api/reset", a.bounded(http.HandlerFunc(a.serveReset)))
	mux.Handle("POST /api/scenario/rollback", a.bounded(http.HandlerFunc(a.serveRollback)))
	mux.Handle("POST /api/credits/charge", a.bounded(http.HandlerFunc(a.serveCharge)))
	mux.Handle("POST /api/credits/grant", a.bounded(http.HandlerFunc(a.serveGrant)))
	mux.Handle("POST /api/credits/reset", a.bounded(http.HandlerFunc(a.serveCreditsReset)))
	return mux
}

// bounded bounds a request's database work by --timeout.
func (a *demoApp) bounded(h http.Handler) http.Handler { return withRequestTimeout(a.timeout, h) }

// costParam is a request's cost: ?cost=N, 1 without one. A cost that does
// not parse is 0, which the middleware answers with 400.
func costParam(r *http.Request) int64 {
	s := r.URL.Query().Get("cost")
	if s == "" {
		return 1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

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
	Checks  checkCounts `json:"checks"`
	Error   string      `json:"error,omitempty"`
}

func describePolicy(p *policy) policyJSON {
	c, m := p.cfg, p.minute.Config()
	refills := (c.Capacity + c.Refill - 1) / c.Refill
	window := time.Duration(refills) * c.Interval
	return policyJSON{
		Gen: p.gen, Prefix: c.Prefix, Capacity: c.Capacity, Refill: c.Refill,
		Interval: c.Interval.String(), IntervalMS: c.Interval.Milliseconds(), Storage: storageName(c.Storage),
		Header: fmt.Sprintf("%q;q=%d;w=%d", c.Prefix, c.Capacity, int64((window+time.Second-1)/time.Second)),
		Minute: fmt.Sprintf("%d per minute", m.Capacity),
	}
}

func storageName(s pgratelimit.Storage) string {
	if s == pgratelimit.Ephemeral {
		return "ephemeral"
	}
	return "durable"
}

// bucketOf is a peeked bucket, with the time to its next refill worked out
// from ResetAfter: full after k more refills, the next of them k-1
// intervals before that.
func bucketOf(r pgratelimit.Result, cfg pgratelimit.Config) bucketJSON {
	b := bucketJSON{Tokens: r.Remaining, Capacity: r.Limit, FullInMS: r.ResetAfter.Milliseconds()}
	if missing := r.Limit - r.Remaining; missing > 0 && r.ResetAfter > 0 {
		k := (missing + cfg.Refill - 1) / cfg.Refill
		next := r.ResetAfter - time.Duration(k-1)*cfg.Interval
		if next <= 0 || next > cfg.Interval {
			next = r.ResetAfter % cfg.Interval
		}
		b.NextRefillMS = max(next.Milliseconds(), 1)
	}
	return b
}

// state peeks at key's buckets (taking nothing) and reads the counters.
func (a *demoApp) state(ctx context.Context, key string) stateJSON {
	p := a.cur.Load()
	st := stateJSON{TimeMS: time.Now().UnixMilli(), Key: key, Policy: describePolicy(p)}
	var errs []error
	if r, err := p.l.Peek(ctx, key); err != nil {
		errs = append(errs, err)
	} else {
		st.Bucket = bucketOf(r, p.cfg)
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
	c, err := a.counts.counts(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	st.Checks = c
	if err := errors.Join(errs...); err != nil {
		st.Error = clierr.Text(err)
	}
	return st
}

func (a *demoApp) clientKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := a.key(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return "", false
	}
	return key, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *demoApp) serveState(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, a.state(r.Context(), key))
}

// eventsEvery is how often the event stream sends the bucket's state.
const eventsEvery = 250 * time.Millisecond

// serveEvents streams the state of the client's bucket as Server-Sent
// Events, every eventsEvery, until the client goes or the server stops.
func (a *demoApp) serveEvents(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
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
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-a.done:
			return
		case <-tick.C:
		}
	}
}

// servePolicy applies a new policy from the form fields capacity, refill,
// interval (a Go duration) and storage.
func (a *demoApp) servePolicy(w http.ResponseWriter, r *http.Request) {
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
func (a *demoApp) serveReset(w http.ResponseWriter, r *http.Request) {
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

// serveRollback charges ?cost= credits inside a transaction (AllowNTx),
// then runs work in the same transaction that fails, and rolls back:
// nothing is spent.
func (a *demoApp) serveRollback(w http.ResponseWriter, r *http.Request) {
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
	res, err := p.l.AllowNTx(ctx, tx, key, out.Cost)
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

// creditsPolicy is the credits scenario's limiter: 100 credits a month, the
// quota renewed whole (Refill == Capacity) on the 1st at midnight UTC, and
// grants spent after it.
var creditsPolicy = pgratelimit.Config{Prefix: creditsPrefix, Capacity: 100, Refill: 100,
	Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Storage: pgratelimit.Durable, Grants: true}

// creditsPeriod says when the credits quota renews, for the page.
const creditsPeriod = "on the 1st of each month (UTC)"

type creditGrantJSON struct {
	Amount    int64  `json:"amount"`
	ExpiresAt string `json:"expires_at,omitempty"` // RFC 3339; empty: never
}

// creditsJSON is the credits scenario's state: the quota (the bucket) and
// the granted balance beside it.
type creditsJSON struct {
	Prefix   string `json:"prefix"`
	Period   string `json:"period"`
	Quota    int64  `json:"quota"`
	Capacity int64  `json:"capacity"`
	// RenewsInMS is the time until the quota is renewed (full again), 0
	// when it is full.
	RenewsInMS int64             `json:"renews_in_ms"`
	Granted    int64             `json:"granted"`
	Grants     []creditGrantJSON `json:"grants"` // live, soonest-expiring first
}

// creditsState peeks at key's quota and grants, taking nothing.
func (a *demoApp) creditsState(ctx context.Context, key string) (creditsJSON, error) {
	r, err := a.credits.Peek(ctx, key)
	if err != nil {
		return creditsJSON{}, err
	}
	gs, err := a.credits.Grants(ctx, key)
	if err != nil {
		return creditsJSON{}, err
	}
	c := creditsJSON{Prefix: creditsPrefix, Period: creditsPeriod, Quota: r.Remaining, Capacity: r.Limit,
		Granted: r.Granted, Grants: make([]creditGrantJSON, len(gs))}
	if r.Remaining < r.Limit {
		c.RenewsInMS = max(r.ResetAfter.Milliseconds(), 1)
	}
	for i, g := range gs {
		c.Grants[i] = creditGrantJSON{Amount: g.Amount}
		if !g.ExpiresAt.IsZero() {
			c.Grants[i].ExpiresAt = g.ExpiresAt.UTC().Format(time.RFC3339)
		}
	}
	return c, nil
}

// resetCredits gives key a full quota and no grants. The library has no
// call that revokes grants (they are credits someone paid for or was
// given), so the demo deletes its own rows of the grants table.
func (a *demoApp) resetCredits(ctx context.Context, key string) error {
	if err := a.credits.Reset(ctx, key); err != nil {
		return err
	}
	del := `DELETE FROM ` + pgx.Identifier{pgratelimit.GrantsTable}.Sanitize() + ` WHERE prefix = $1 AND key = $2`
	if _, err := a.pool.Exec(ctx, del, creditsPrefix, key); err != nil {
		return fmt.Errorf("delete the grants of %q: %w", key, err)
	}
	return nil
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
func (a *demoApp) serveCharge(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	cost := costParam(r)
	if cost < 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("cost must be a whole number of at least 1, got %q", r.URL.Query().Get("cost"))})
		return
	}
	fail := func(err error) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
	}
	// What the grants held before, to tell how much of the charge they
	// paid: the check takes from the quota first, so the rest came from
	// them. (Read apart from the check: exact while nobody else grants or
	// charges this key meanwhile, as on the demo's page.)
	before, err := a.credits.Peek(ctx, key)
	if err != nil {
		fail(err)
		return
	}
	ls := []*pgratelimit.Limiter{a.credits}
	m, err := pgratelimit.AllowAll(ctx, pgratelimit.Charge{Limiter: a.credits, Key: key, Cost: cost})
	if err != nil {
		fail(err)
		return
	}
	res := m.Results[0]
	out := chargeJSON{Allowed: m.Allowed, Cost: cost, Quota: res.Remaining, Capacity: res.Limit, Granted: res.Granted}
	f := httplimit.FieldsFor(ls, m)
	w.Header().Set("RateLimit-Policy", f.Policy)
	w.Header().Set("RateLimit", f.RateLimit)
	status := http.StatusOK
	if m.Allowed {
		out.FromGrants = min(max(before.Granted-res.Granted, 0), cost)
		out.FromQuota = cost - out.FromGrants
		if out.FromGrants == 0 {
			out.Message = fmt.Sprintf("Charged %d from the monthly quota: %d of %d left, %d granted.", cost, res.Remaining, res.Limit, res.Granted)
		} else {
			out.Message = fmt.Sprintf("Charged %d: %d from the monthly quota (%d of %d left), %d from grants (%d left).",
				cost, out.FromQuota, res.Remaining, res.Limit, out.FromGrants, res.Granted)
		}
	} else {
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", f.RetryAfter)
		out.Message = fmt.Sprintf("Denied: a charge of %d is more than the %d left of the monthly quota and the %d granted; nothing taken. ",
			cost, res.Remaining, res.Granted)
		if m.RetryAfter == pgratelimit.InfDuration {
			out.Message += fmt.Sprintf("Even a full quota (%d) would not cover it: grant credits.", res.Limit)
		} else {
			out.Message += fmt.Sprintf("The quota renews in %s; or grant credits.", fmtLong(m.RetryAfter))
		}
	}
	writeJSON(w, status, out)
}

// serveGrant grants ?amount= credits to the client, expiring after
// ?expires_in= (a Go duration; never without one).
func (a *demoApp) serveGrant(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	bad := func(format string, args ...any) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf(format, args...)})
	}
	amount, err := strconv.ParseInt(r.FormValue("amount"), 10, 64)
	if err != nil || amount < 1 {
		bad("amount must be a whole number of at least 1, got %q", r.FormValue("amount"))
		return
	}
	var expiresAt time.Time
	if s := r.FormValue("expires_in"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			bad("expires_in must be a positive duration such as 1h or 168h, got %q", s)
			return
		}
		expiresAt = time.Now().Add(d)
	}
	if _, err := a.credits.Grant(ctx, key, amount, expiresAt); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		return
	}
	c, err := a.creditsState(ctx, key)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		return
	}
	expires := "never expires"
	if !expiresAt.IsZero() {
		expires = "expires in " + fmtLong(time.Until(expiresAt))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"message": fmt.Sprintf("Granted %d credits (%s): %d granted in all, beside the quota's %d of %d.", amount, expires, c.Granted, c.Quota, c.Capacity),
		"credits": c,
	})
}

// serveCreditsReset gives the client a full quota and no grants.
func (a *demoApp) serveCreditsReset(w http.ResponseWriter, r *http.Request) {
	key, ok := a.clientKey(w, r)
	if !ok {
		return
	}
	if err := a.resetCredits(r.Context(), key); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		return
	}
	c, err := a.creditsState(r.Context(), key)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": clierr.Text(err)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"message": fmt.Sprintf("Started over: a full quota of %d, no grants.", c.Capacity),
		"credits": c,
	})
}

// fmtLong writes a long duration for people: to the second under an
// hour, to the minute under a day, in days and hours from a day up.
func fmtLong(d time.Duration) string {
	switch {
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		if m := int64(d%time.Hour) / int64(time.Minute); m != 0 {
			return fmt.Sprintf("%d h %d min", int64(d/time.Hour), m)
		}
		return fmt.Sprintf("%d h", int64(d/time.Hour))
	}
	h := int64(d.Round(time.Hour) / time.Hour)
	if h%24 == 0 {
		return fmt.Sprintf("%d days", h/24)
	}
	return fmt.Sprintf("%d days %d h", h/24, h%24)
}

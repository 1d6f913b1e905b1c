package demo

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/ui"
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

// firstPolicy is the demo's first policy: burst 5, then 1 request per
// second.
func firstPolicy() pgratelimit.Config {
	return pgratelimit.Config{Prefix: demoPrefix, Capacity: 5, Refill: 1, Interval: time.Second, Storage: pgratelimit.Ephemeral}
}

// policy is the limiter the page's requests go through, replaced whole when
// the page applies a new one.
type policy struct {
	gen    int
	l      *pgratelimit.Limiter
	minute *pgratelimit.Limiter // the two-limits scenario's per-minute limit
}

// app serves the page, the rate-limited endpoints behind the real
// middleware, the bucket's live state and the scenarios.
type app struct {
	pool    *pgxpool.Pool
	credits atomic.Pointer[pgratelimit.Limiter] // the credits scenario's: a monthly quota, grants and alerts
	jobs    *jobs                               // the jobs card's: leases of a Semaphore
	log     *slog.Logger
	timeout time.Duration // each request's database work; 0: none
	key     httplimit.KeyFunc

	mu  sync.Mutex // serializes applies
	cur atomic.Pointer[policy]

	done     chan struct{} // closed when the server shuts down: ends event streams
	doneOnce sync.Once
}

// newApp makes the app on pool, its requests' database work bounded by
// timeout (0: none), its jobs run as jc says.
func newApp(pool *pgxpool.Pool, log *slog.Logger, timeout time.Duration, jc jobsConfig) (*app, error) {
	a := &app{
		pool:    pool,
		log:     log,
		timeout: timeout,
		key:     httplimit.KeyByIP(httplimit.IPKeyConfig{}),
		done:    make(chan struct{}),
	}
	if err := a.newCredits(); err != nil {
		return nil, err
	}
	j, err := newJobs(pool, log, jc)
	if err != nil {
		return nil, err
	}
	a.jobs = j
	return a, nil
}

// newCredits makes the credits scenario's limiter anew.
func (a *app) newCredits() error {
	l, err := pgratelimit.New(a.pool, creditsPolicy())
	if err != nil {
		return err
	}
	a.credits.Store(l)
	return nil
}

// apply makes cfg the page's policy: a new limiter, and a fresh (full)
// bucket for key, when not empty.
func (a *app) apply(ctx context.Context, cfg pgratelimit.Config, key string) (*policy, error) {
	cfg.Prefix = demoPrefix
	l, err := pgratelimit.New(a.pool, cfg)
	if err != nil {
		return nil, err
	}
	// The per-minute limit of the two-limits scenario: twice the burst,
	// refilled whole every minute.
	mcfg := pgratelimit.Config{Prefix: minutePrefix, Capacity: 2 * cfg.Capacity, Refill: 2 * cfg.Capacity, Interval: time.Minute, Storage: cfg.Storage}
	if mcfg.Capacity <= 0 { // overflowed
		mcfg.Capacity, mcfg.Refill = cfg.Capacity, cfg.Capacity
	}
	minute, err := pgratelimit.New(a.pool, mcfg)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &policy{l: l, minute: minute}
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

// shutdown ends the event streams: the server is shutting down.
func (a *app) shutdown() { a.doneOnce.Do(func() { close(a.done) }) }

// handler is the demo's whole HTTP surface.
func (a *app) handler() (http.Handler, error) {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFiles, "web")
	mux.Handle("GET /", http.FileServerFS(static))

	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from behind the rate limiter")
	})
	limit := func(pick func(p *policy) []*pgratelimit.Limiter) (func(http.Handler) http.Handler, error) {
		return httplimit.Middleware(httplimit.Config{
			KeyFunc: a.key,
			Cost:    costParam,
			Logger:  a.log,
			Limiters: func(*http.Request, string) ([]*pgratelimit.Limiter, error) {
				return pick(a.cur.Load()), nil
			},
		})
	}
	one, err := limit(func(p *policy) []*pgratelimit.Limiter { return []*pgratelimit.Limiter{p.l} })
	if err != nil {
		return nil, err
	}
	two, err := limit(func(p *policy) []*pgratelimit.Limiter { return []*pgratelimit.Limiter{p.l, p.minute} })
	if err != nil {
		return nil, err
	}
	mux.Handle("GET /api/limited", a.bounded(one(hello)))
	mux.Handle("GET /api/two-limits", a.bounded(two(hello)))

	mux.Handle("GET /api/state", a.bounded(a.keyed(a.serveState)))
	mux.Handle("GET /api/events", a.keyed(a.serveEvents))
	mux.Handle("POST /api/policy", a.bounded(a.keyed(a.servePolicy)))
	mux.Handle("POST /api/reset", a.bounded(a.keyed(a.serveReset)))
	mux.Handle("POST /api/scenario/rollback", a.bounded(a.keyed(a.serveRollback)))
	mux.Handle("POST /api/credits/charge", a.bounded(a.keyed(a.serveCharge)))
	mux.Handle("POST /api/credits/grant", a.bounded(a.keyed(a.serveGrant)))
	mux.Handle("POST /api/credits/reset", a.bounded(a.keyed(a.serveCreditsReset)))
	mux.Handle("POST /api/jobs/start", a.bounded(a.keyed(a.serveJobStart)))
	mux.Handle("POST /api/jobs/kill", a.bounded(a.keyed(a.serveJobKill)))
	mux.Handle("POST /api/jobs/reset", a.bounded(a.keyed(a.serveJobsReset)))

	// The operator UI, on the credits and the jobs (the page's own
	// limiter changes policy as the page applies new ones). An app mounts
	// it behind its own auth: the demo serves only its own machine.
	admin, err := ui.NewHandler(ui.Config{Pool: a.pool, Limiters: []*pgratelimit.Limiter{a.credits.Load()},
		Semaphores: []*pgratelimit.Semaphore{a.jobs.sem}, Prefix: "/admin", Logger: a.log})
	if err != nil {
		return nil, err
	}
	mux.Handle("GET /admin/", a.bounded(admin)) // (a pattern with a method each, beside "GET /")
	mux.Handle("POST /admin/", a.bounded(admin))
	return mux, nil
}

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

// bounded bounds each request's work (the limiter's database work in the
// middleware) by the app's timeout (the command's --timeout), when set.
func (a *app) bounded(h http.Handler) http.Handler {
	if a.timeout <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

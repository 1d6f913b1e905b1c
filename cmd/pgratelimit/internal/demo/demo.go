// Package demo is `pgratelimit demo` (and `make demo`): a small app behind
// pgratelimit's HTTP middleware (burst 5, then 1 request per second per
// client IP) and a page to try it on. Run sends the app seven requests,
// prints what came back, and keeps serving the app and the page until
// interrupted (or returns, with Options.Once).
//
// The page (web/, embedded: it works offline, with no build step) sends its
// requests through the real middleware, shows the client's bucket refilling
// from a stream of its state, applies new policies and runs the scenarios:
// a burst, steady traffic at 90% of the rate, two limits in one AllowAll,
// credits charged in a transaction that rolls back, and credits from a
// monthly quota and grants, with usage alerts that a Consumer in the demo
// delivers; and long jobs, at most 3 at once, each holding a concurrency
// lease it extends while it runs (a Semaphore), one of which can be killed
// to watch its slot come back when its lease expires.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/pflag"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/throwaway"
	"github.com/pgratelimit/pgratelimit/migrations"
)

// Options is how the demo runs: its flags (AddFlags) and what the command
// gives it.
type Options struct {
	// Addr is where the app and the page are served (--addr).
	Addr string
	// Once makes Run return after the seven requests, without serving the
	// page (--once).
	Once bool

	// DatabaseURL is the database the demo uses; empty: a throwaway
	// PostgreSQL that Run starts from the installed server binaries and
	// removes when it returns.
	DatabaseURL string
	// PrepareConn, if not nil, sets up the connection configuration (the
	// command's connect timeout).
	PrepareConn func(*pgconn.Config)
	// Bound, if not nil, bounds the database work of the set-up (the
	// command's --timeout).
	Bound func(context.Context) (context.Context, context.CancelFunc)
	// Timeout bounds each request's database work; 0: no bound.
	Timeout time.Duration
	// Stdout receives the walkthrough and what to try; Stderr the app's log.
	Stdout, Stderr io.Writer

	throwaway string // the URL of the throwaway PostgreSQL Run started, if it did
	// jobs is how the jobs card's jobs run (zero: the defaults; tests
	// shorten them).
	jobs jobsConfig
}

// AddFlags defines the demo's flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:8080", "address to serve the app and the page on")
	fs.BoolVar(&o.Once, "once", false, "exit after the seven requests, without serving the page")
}

// Run runs the demo until ctx is done (or, with Once, until the seven
// requests are answered). An interrupt is not an error: Run says so and
// returns nil, after the set-up too (make demo would report a failure).
func Run(ctx context.Context, o Options) error {
	err := run(ctx, o)
	if err != nil && ctx.Err() != nil {
		fmt.Fprintln(o.Stdout, "\nInterrupted.")
		return nil
	}
	return err
}

func run(ctx context.Context, o Options) error {
	url, stop, err := o.database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	if o.PrepareConn != nil {
		o.PrepareConn(&pcfg.ConnConfig.Config)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, a, err := o.setUp(ctx, pool)
	if err != nil {
		return err
	}
	defer ln.Close()
	defer a.jobs.stop() // (after the server's shutdown: its running jobs release their leases)
	stopConsumer, err := a.startConsumer(ctx)
	if err != nil {
		return err
	}
	defer stopConsumer()
	h, err := a.handler()
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(a.shutdown)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	return o.walkthrough(ctx, pool, "http://"+ln.Addr().String()+"/", "ip:"+host, served)
}

// database returns the database's URL: Options.DatabaseURL, or a throwaway
// PostgreSQL's (whose URL it prints, for the CLI), which stop stops and
// removes.
func (o *Options) database(ctx context.Context) (url string, stop func(), err error) {
	if o.DatabaseURL != "" {
		return o.DatabaseURL, func() {}, nil
	}
	fmt.Fprintln(o.Stdout, "No DATABASE_URL: starting a throwaway PostgreSQL...")
	db, err := throwaway.Start(ctx, 0)
	if err != nil {
		return "", nil, fmt.Errorf("%w; or set DATABASE_URL to a PostgreSQL of yours", err)
	}
	o.throwaway = db.URL
	fmt.Fprintf(o.Stdout, "Started PostgreSQL %s, removed when the demo stops: DATABASE_URL=%s\n", db.Version, db.URL)
	return db.URL, func() {
		if err := db.Close(ctx); err != nil {
			fmt.Fprintln(o.Stderr, "stopping the throwaway PostgreSQL:", err)
		} else {
			fmt.Fprintln(o.Stdout, "Stopped and removed the throwaway PostgreSQL.")
		}
	}, nil
}

// setUp applies the migrations, listens on Addr, and makes the app with its
// first policy and a fresh bucket, credits and jobs' slots for the client
// on this address (KeyByIP), so that a re-run against the same database
// starts with a full bucket. Its database work is bounded by Options.Bound.
func (o Options) setUp(ctx context.Context, pool *pgxpool.Pool) (net.Listener, *app, error) {
	if o.Bound != nil {
		var cancel context.CancelFunc
		ctx, cancel = o.Bound(ctx)
		defer cancel()
	}
	db := stdlib.OpenDBFromPool(pool)
	err := migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintln(o.Stdout, "Migrations applied.")
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s (choose another with --addr): %w", o.Addr, err)
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	a, err := newApp(pool, slog.New(slog.NewTextHandler(o.Stderr, nil)), o.Timeout, o.jobs)
	if err == nil {
		_, err = a.apply(ctx, firstPolicy(), "ip:"+host)
	}
	if err == nil {
		err = a.resetCredits(ctx, "ip:"+host)
	}
	if err == nil {
		err = a.jobs.reset(ctx, "ip:"+host) // the leases a run before left
	}
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return ln, a, nil
}

// walkthrough sends the app seven requests, prints what came back and,
// unless Once, what to try (with the CLI on key's credits), then waits until
// ctx is done or the server fails.
func (o Options) walkthrough(ctx context.Context, pool *pgxpool.Pool, page, key string, served <-chan error) error {
	limited := page + "api/limited"
	fmt.Fprintf(o.Stdout, "Serving %s: burst of 5, then 1 request per second per client IP.\n\n", limited)
	// Refills fall on whole seconds of the database's clock: the seven
	// requests start just after one, so that none falls between them.
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err == nil {
		time.Sleep(time.Second - dbNow.Sub(dbNow.Truncate(time.Second)) + 20*time.Millisecond)
	}
	policy, err := o.sendSeven(ctx, limited)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Stdout, "\nRateLimit-Policy: %s  (quota 5, refilled from empty in 5s)\n", policy)
	if o.Once {
		return nil
	}
	fmt.Fprintf(o.Stdout, "\nThe page:         %s  (send requests, watch the bucket refill, change the policy)\n", page)
	fmt.Fprintf(o.Stdout, "The operator UI:  %sadmin/  (the credits' and jobs' keys: balance, grants, ledger, leases, alerts; grant, refund, reset)\n", page)
	fmt.Fprintf(o.Stdout, "Try it by hand:   curl -i %s\n", limited)
	cp := creditsPolicy()
	fmt.Fprintf(o.Stdout, "Credits:          curl -i -X POST '%sapi/credits/charge?cost=7'  (a monthly quota of %d; grant with api/credits/grant?amount=10)\n",
		page, cp.Capacity)
	fmt.Fprintf(o.Stdout, "The CLI:          pgratelimit balance %s --prefix %s --capacity %d --refill %d --every month  (the credits above)\n",
		key, cp.Prefix, cp.Capacity, cp.Refill)
	fmt.Fprintf(o.Stdout, "                  pgratelimit events --prefix %s --key %s --follow  (their usage alerts)\n", cp.Prefix, key)
	fmt.Fprintf(o.Stdout, "                  pgratelimit leases %s --prefix %s --max %d  (the jobs' leases)\n", key, jobsPrefix, jobsMax)
	if o.throwaway != "" {
		fmt.Fprintf(o.Stdout, "                  in a shell with: export DATABASE_URL=%s\n", o.throwaway)
	}
	fmt.Fprintln(o.Stdout, "Ctrl-C to stop.")
	select {
	case <-ctx.Done():
		fmt.Fprintln(o.Stdout, "\nStopping.")
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// sendSeven sends seven requests to url, prints each one's status and
// headers, and returns the RateLimit-Policy header.
func (o Options) sendSeven(ctx context.Context, url string) (policy string, err error) {
	client := &http.Client{Timeout: 10 * time.Second}
	for i := 1; i <= 7; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return "", err
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		policy = resp.Header.Get("RateLimit-Policy")
		line := fmt.Sprintf("request %d: %d %-17s RateLimit: %s", i, resp.StatusCode, http.StatusText(resp.StatusCode), resp.Header.Get("RateLimit"))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			line += "  Retry-After: " + ra
		}
		fmt.Fprintln(o.Stdout, line)
	}
	return policy, nil
}

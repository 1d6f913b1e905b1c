package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/migrations"
)

// runDemo serves a small app behind the middleware (burst 5, 1 token per
// second per client IP) and a page to try it on (see demoweb.go), sends the
// app seven requests, prints what came back, and keeps serving until
// interrupted (or exits with --once).
func runDemo(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "demo")
	addr := f.String("addr", "127.0.0.1:8080", "address to serve the app and the page on")
	once := f.Bool("once", false, "exit after the seven requests, without serving the page")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	if err := demo(ctx, c, f, *addr, *once); err != nil {
		if ctx.Err() != nil {
			// Ctrl-C while starting up: the user's choice, not a failure
			// (make demo would report one).
			fmt.Fprintln(c.stdout, "\nInterrupted.")
			return exitOK
		}
		return f.fail(err)
	}
	return exitOK
}

func demo(ctx context.Context, c *cli, f *flags, addr string, once bool) error {
	u := f.databaseURL
	if u == "" {
		u = c.getenv("DATABASE_URL")
	}
	if u == "" {
		fmt.Fprintln(c.stdout, "No DATABASE_URL: starting a throwaway PostgreSQL...")
		in, err := pglaunch.Start(ctx, pglaunch.Options{})
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := in.Close(sctx); err != nil {
				fmt.Fprintln(c.stderr, "stopping the throwaway PostgreSQL:", err)
			} else if in.Source != "env" {
				fmt.Fprintln(c.stdout, "Stopped and removed the throwaway PostgreSQL.")
			}
		}()
		fmt.Fprintf(c.stdout, "Started PostgreSQL (%s).\n", in.Source)
		u = in.URL
	}
	pcfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	f.prepare(&pcfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The set-up's database work is bounded by --timeout.
	sctx, cancel := f.withTimeout(ctx)
	defer cancel()
	db := stdlib.OpenDBFromPool(pool)
	err = migrations.Up(sctx, db)
	db.Close()
	if err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, "Migrations applied.")

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (choose another with --addr): %w", addr, err)
	}
	defer ln.Close()
	// The page's client, and the walkthrough's, is this address (KeyByIP):
	// a re-run against the same database starts with a full bucket.
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	app, err := newDemoApp(pool, slog.New(slog.NewTextHandler(c.stderr, nil)), f.timeout)
	if err != nil {
		return err
	}
	if _, err := app.apply(sctx, demoPolicy, "ip:"+host); err != nil {
		return err
	}
	if err := app.resetCredits(sctx, "ip:"+host); err != nil {
		return err
	}
	cancel() // set up

	srv := &http.Server{Handler: app.handler(), ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(app.shutdown)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	page := "http://" + ln.Addr().String() + "/"
	limited := page + "api/limited"
	fmt.Fprintf(c.stdout, "Serving %s: burst of 5, then 1 request per second per client IP.\n\n", limited)

	client := &http.Client{Timeout: 10 * time.Second}
	// Refills fall on whole seconds of the database's clock: the seven
	// requests start just after one, so that none falls between them.
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err == nil {
		time.Sleep(time.Second - dbNow.Sub(dbNow.Truncate(time.Second)) + 20*time.Millisecond)
	}
	var policy string
	for i := 1; i <= 7; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, limited, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		policy = resp.Header.Get("RateLimit-Policy")
		line := fmt.Sprintf("request %d: %d %-17s RateLimit: %s", i, resp.StatusCode, http.StatusText(resp.StatusCode), resp.Header.Get("RateLimit"))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			line += "  Retry-After: " + ra
		}
		fmt.Fprintln(c.stdout, line)
	}
	fmt.Fprintf(c.stdout, "\nRateLimit-Policy: %s  (quota 5, refilled from empty in 5s)\n", policy)
	if once {
		return nil
	}
	fmt.Fprintf(c.stdout, "\nThe page:         %s  (send requests, watch the bucket refill, change the policy)\n", page)
	fmt.Fprintf(c.stdout, "Try it by hand:   curl -i %s\n", limited)
	fmt.Fprintf(c.stdout, "Credits:          curl -i -X POST '%sapi/credits/charge?cost=7'  (a monthly quota of %d; grant with api/credits/grant?amount=10)\nCtrl-C to stop.\n",
		page, creditsPolicy.Capacity)
	select {
	case <-ctx.Done():
		fmt.Fprintln(c.stdout, "\nStopping.")
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// withRequestTimeout bounds each request's work (the limiter's database
// work in the middleware) by d, when d > 0.
func withRequestTimeout(d time.Duration, h http.Handler) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

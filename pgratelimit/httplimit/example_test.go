package httplimit_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// Two policies per API key, per second and per day, enforced together, and
// the limits picked per request from the customer's plan.
func ExampleConfig_limiters() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	limit := func(prefix string, n int64, per time.Duration) *pgratelimit.Limiter {
		l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: prefix, Capacity: n, Refill: n, Interval: per})
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	plans := map[string][]*pgratelimit.Limiter{
		"free": {limit("second", 2, time.Second), limit("day", 1_000, 24*time.Hour)},
		"pro":  {limit("second", 50, time.Second), limit("day", 100_000, 24*time.Hour)},
	}
	planOf := func(apiKeyHash string) string { return "free" } // your lookup

	mw, err := httplimit.Middleware(httplimit.Config{
		KeyFunc: httplimit.KeyByHeader("X-API-Key"),
		Limiters: func(r *http.Request, key string) ([]*pgratelimit.Limiter, error) {
			return plans[planOf(key)], nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mw(api)))
}

// A new limit rolled out in shadow mode, behind the limit already enforced:
// its would-be denials are logged and counted (pgratelimit.checks with
// pgratelimit.shadow=true) and nothing is denied. Each check is bounded: a
// database that stops answering costs a request at most 500ms, then 503.
func ExampleConfig_shadow() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	api, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 20, Refill: 10, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	exports, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "exports", Capacity: 10, Refill: 10, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	enforced, err := httplimit.Middleware(httplimit.Config{CheckTimeout: 500 * time.Millisecond}, api)
	if err != nil {
		log.Fatal(err)
	}
	shadowed, err := httplimit.Middleware(httplimit.Config{
		KeyFunc:      httplimit.KeyByHeader("X-API-Key"),
		Shadow:       true,
		CheckTimeout: 500 * time.Millisecond,
	}, exports)
	if err != nil {
		log.Fatal(err)
	}
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("export")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", enforced(shadowed(export))))
}

package httplimit_test

// The README's code: each example below is a block of README.md or
// docs/*.md as it is here (internal/readme's tests check that they match).

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

func ExampleMiddleware() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "api", Capacity: 2, Refill: 2, Interval: time.Minute,
		Storage: pgratelimit.Ephemeral, // request rates: no WAL
	})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{
		KeyFunc: httplimit.KeyByIP(httplimit.IPKeyConfig{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, // your load balancers
		}),
		Exempt: httplimit.ExemptPaths("/healthz"),
	}, limiter)
	if err != nil {
		log.Fatal(err)
	}
	app := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	// A service serves it: log.Fatal(http.ListenAndServe(":8080", app))
	for _, path := range []string{"/a", "/b", "/c", "/healthz"} {
		w := httptest.NewRecorder()
		app.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// /a 200 "api";q=2;w=60
	// /b 200 "api";q=2;w=60
	// /c 429 "api";q=2;w=60
	// /healthz 200
}

// docs/shadow-mode.md: a new limit in shadow mode behind an enforced one.
func Example_readmeShadow() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	api, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "api", Capacity: 10, Refill: 1, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	exportHandler := http.NotFoundHandler()
	// A new limit on exports, in shadow mode behind the enforced API limit
	// (api, a *pgratelimit.Limiter already in use).
	enforced, err := httplimit.Middleware(httplimit.Config{}, api)
	if err != nil {
		log.Fatal(err)
	}
	exports, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "exports", Capacity: 10, Refill: 10, Interval: time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	shadowed, err := httplimit.Middleware(httplimit.Config{
		KeyFunc: httplimit.KeyByHeader("X-API-Key"),
		Shadow:  true,
	}, exports)
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("/exports/", enforced(shadowed(exportHandler)))
}

// docs/middleware.md: Two policies per API key, per second and per day, enforced together, and
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

package httplimit_test

// The README's code, compiled: each fragment below appears in README.md or
// docs/*.md as it is here (internal/readme's test checks that they match).

import (
	"context"
	"log"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// README, HTTP: a limit per client address behind load balancers.
func Example_readmeMiddleware() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "api", Capacity: 20, Refill: 1, Interval: time.Second,
		Storage: pgratelimit.Ephemeral,
	})
	if err != nil {
		log.Fatal(err)
	}
	mw := httplimit.Middleware(limiter, httplimit.Options{
		KeyFunc: httplimit.KeyByIP(httplimit.IPKeyConfig{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, // your load balancers
			IPv6Prefix:     64,
		}),
	})
	log.Fatal(http.ListenAndServe(":8080", mw(mux)))
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
	enforced := httplimit.Middleware(api, httplimit.Options{})
	exports, err := pgratelimit.New(pool, pgratelimit.Config{
		Prefix: "exports", Capacity: 10, Refill: 10, Interval: time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	shadowed := httplimit.Middleware(exports, httplimit.Options{
		KeyFunc: httplimit.KeyByHeader("X-API-Key"),
		Shadow:  true,
	})
	mux.Handle("/exports/", enforced(shadowed(exportHandler)))
}

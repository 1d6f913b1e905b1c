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

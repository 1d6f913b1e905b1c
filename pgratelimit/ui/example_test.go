package ui_test

// The README's example of the operator UI (internal/readme's tests check
// that the block matches this function, and run it as a reader pastes it).

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/ui"
)

func Example_operatorUI() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	credits, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "credits", Capacity: 500, Refill: 500,
		Calendar: pgratelimit.Calendar{Every: pgratelimit.Month}, Grants: true, Ledger: true})
	if err != nil {
		log.Fatal(err)
	}
	// The app's limiters: the UI acts through them, with their policies.
	admin, err := ui.NewHandler(ui.Config{Pool: pool, Limiters: []*pgratelimit.Limiter{credits}, Prefix: "/admin"})
	if err != nil {
		log.Fatal(err)
	}
	// It has no auth of its own: wrap it in the app's.
	isOperator := func(r *http.Request) bool { return r.Header.Get("X-Demo-Operator") == "alice" } // your session check
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isOperator(r) {
			http.Error(w, "operators only", http.StatusForbidden)
			return
		}
		admin.ServeHTTP(w, r)
	}))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, who := range []string{"mallory", "alice"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/admin/key?prefix=credits&key=customer-42", nil)
		req.Header.Set("X-Demo-Operator", who)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(who, resp.StatusCode)
	}
	// Output:
	// mallory 403
	// alice 200
}

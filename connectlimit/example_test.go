package connectlimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pgratelimit/pgratelimit/connectlimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A Connect handler limited per API key (the X-API-Key header, hashed):
// bursts of 20, then 10 a second. Generated handlers take the same option:
// greetv1connect.NewGreetServiceHandler(svc, connect.WithInterceptors(limit)).
func ExampleNewInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "connect", Capacity: 20, Refill: 10, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := connectlimit.NewInterceptor(connectlimit.Config{
		KeyFunc:      connectlimit.KeyByHeader("X-API-Key"),
		CheckTimeout: 500 * time.Millisecond,
	}, l)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	const procedure = "/echo.v1.EchoService/Echo"
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(req.Msg), nil
		},
		connect.WithInterceptors(limit),
	))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// A new limit rolled out in shadow mode: calls are checked and would-be
// denials logged and counted (pgratelimit.checks with
// pgratelimit.shadow=true), and nothing is denied.
func ExampleConfig_shadow() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "reports", Capacity: 100, Refill: 100, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := connectlimit.NewInterceptor(connectlimit.Config{Shadow: true}, l)
	if err != nil {
		log.Fatal(err)
	}
	_ = connect.WithInterceptors(limit) // give it to the handlers
}

// A Connect handler limited per client address, with the health check
// exempt, and a client that sees the denial (the README's Connect block is
// this example, with its imports).
func Example_readme() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // migrated: see the quick start
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "connect", Capacity: 1, Refill: 1, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := connectlimit.NewInterceptor(connectlimit.Config{
		Exempt: connectlimit.ExemptProcedures("grpc.health.v1.Health"),
	}, limiter)
	if err != nil {
		log.Fatal(err)
	}
	// An echo service; a generated handler takes the same option:
	// mux.Handle(echov1connect.NewEchoServiceHandler(svc, connect.WithInterceptors(limit)))
	const procedure = "/echo.v1.EchoService/Echo"
	echo := func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		return connect.NewResponse(req.Msg), nil
	}
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, echo, connect.WithInterceptors(limit)))
	srv := httptest.NewServer(mux) // a service serves it: log.Fatal(http.ListenAndServe(":8080", mux))
	defer srv.Close()

	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+procedure)
	for range 2 {
		_, err := client.CallUnary(ctx, connect.NewRequest(wrapperspb.String("hi")))
		var denied *connect.Error
		if errors.As(err, &denied) {
			fmt.Println(denied.Code(), "retry after", denied.Meta().Get("Retry-After") != "")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("ok")
	}
	// Output:
	// ok
	// resource_exhausted retry after true
}

package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A gRPC server whose unary calls and streams are limited per client
// address: bursts of 20, then 10 a second. Behind a load balancer at
// 10.0.0.0/8, the client is read from x-forwarded-for.
func ExampleNewInterceptor() {
	ctx := context.Background()
	// connect_timeout bounds a connection attempt; the interceptors bound
	// each check (DefaultCheckTimeout) whatever the pool does.
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "grpc", Capacity: 20, Refill: 10, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := grpclimit.NewInterceptor(grpclimit.Config{
		KeyFunc: grpclimit.KeyByPeer(grpclimit.IPKeyConfig{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		}),
		CheckTimeout: 500 * time.Millisecond,
	}, l)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(limit.Unary), grpc.ChainStreamInterceptor(limit.Stream))
	// Register your services on srv here.
	ln, err := net.Listen("tcp", ":50051")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))
}

// Streams weighed by method, keyed by an API key from the metadata, in
// shadow mode while the limit is new: nothing is denied, would-be denials
// are logged and counted (pgratelimit.checks with pgratelimit.shadow=true).
func ExampleConfig_shadow() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "exports", Capacity: 10, Refill: 10, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := grpclimit.NewInterceptor(grpclimit.Config{
		KeyFunc: grpclimit.KeyByMetadata("x-api-key"),
		Cost: func(_ context.Context, method string) int64 {
			if method == "/exports.v1.Exports/ExportAll" {
				return 5
			}
			return 1
		},
		Shadow: true,
	}, l)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(limit.Stream))
	_ = srv // register services and serve
}

// For a chain built from go-grpc-middleware v2: its ratelimit interceptors
// with this package's Limit. Failing open, since the chain reports every
// error as ResourceExhausted.
func ExampleMiddlewareLimiter() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "grpc", Capacity: 20, Refill: 10, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := grpclimit.MiddlewareLimiter(grpclimit.Config{FailOpen: true}, l)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(limiter)),
		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(limiter)),
	)
	_ = srv // register services and serve
}

// A server whose calls and streams are limited per client address, with
// health checks exempt, and a client that reads the RetryInfo detail of a
// denial (the README's gRPC blocks are from here).
func Example_readme() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		log.Fatal(err)
	}
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "grpc", Capacity: 1, Refill: 1, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := grpclimit.NewInterceptor(grpclimit.Config{
		Exempt: grpclimit.ExemptMethods("grpc.reflection.v1.ServerReflection"),
	}, limiter)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(limit.Unary), grpc.StreamInterceptor(limit.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // your services here
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 2 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		var wait time.Duration
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.RetryInfo); ok { // google.golang.org/genproto/googleapis/rpc/errdetails
				wait = info.GetRetryDelay().AsDuration()
			}
		}
		fmt.Println(st.Code(), wait > 0)
	}
	// Output:
	// OK false
	// ResourceExhausted true
}

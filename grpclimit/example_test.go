package grpclimit_test

import (
	"context"
	"log"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/pgratelimit/pgratelimit/grpclimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/pgratelimit/pgratelimit/pgratelimit/httplimit"
)

// A gRPC server whose unary calls and streams are limited per client
// address: bursts of 20, then 10 a second. Behind a load balancer at
// 10.0.0.0/8, the client is read from x-forwarded-for.
func ExampleUnaryServerInterceptor() {
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
	opts := []grpclimit.Option{
		grpclimit.WithKeyFunc(grpclimit.KeyByPeer(httplimit.IPKeyConfig{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		})),
		grpclimit.WithCheckTimeout(500 * time.Millisecond),
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(l, opts...)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(l, opts...)),
	)
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
func ExampleStreamServerInterceptor() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	l, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "exports", Capacity: 10, Refill: 10, Interval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(l,
		grpclimit.WithKeyFunc(grpclimit.KeyByMetadata("x-api-key")),
		grpclimit.WithCost(func(_ context.Context, method string) int64 {
			if method == "/exports.v1.Exports/ExportAll" {
				return 5
			}
			return 1
		}),
		grpclimit.WithShadow(),
	)))
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
	limiter := grpclimit.MiddlewareLimiter(l, grpclimit.WithFailOpen())
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(limiter)),
		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(limiter)),
	)
	_ = srv // register services and serve
}

// README, gRPC: the interceptors with their defaults.
func Example_readme() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "grpc", Capacity: 20, Refill: 10, Interval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(limiter)),
		grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(limiter)),
	)
	_ = srv
}

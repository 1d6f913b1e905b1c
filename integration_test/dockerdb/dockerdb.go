// Package dockerdb starts a PostgreSQL container with testcontainers-go, for
// the test harness (testdb.Container). It lives in the integration tests'
// module so that the library module never depends on testcontainers-go or the
// Docker client.
package dockerdb

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Image is the container image started.
const Image = "postgres:15-alpine"

// Start starts a PostgreSQL container and returns its URL and how to stop it,
// or an error at once when no Docker engine answers.
func Start(ctx context.Context) (url string, stop func(context.Context) error, err error) {
	// testcontainers panics in some environments without Docker; a panic
	// here only means "no Docker".
	defer func() {
		if r := recover(); r != nil {
			url, stop, err = "", nil, fmt.Errorf("%v", r)
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	prov, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", nil, err
	}
	defer prov.Close()
	if err := prov.Health(pctx); err != nil {
		return "", nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, Image,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.WithoutCancel(ctx))
		}
		return "", nil, err
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = ctr.Terminate(context.WithoutCancel(ctx))
		return "", nil, err
	}
	return u, func(ctx context.Context) error { return ctr.Terminate(ctx) }, nil
}

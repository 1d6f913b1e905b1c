// Package testdb gives tests a real, migrated PostgreSQL: one server per test
// binary (from pglaunch: PGRATELIMIT_TEST_DATABASE_URL, a container when the
// test binary sets Container, or the local server binaries) and a schema of its own per test, so tests can run in
// parallel.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/migrations"
)

// EnvVar names the variable that points the tests at an existing database
// instead of starting one. The tests create and drop schemas in it.
const EnvVar = "PGRATELIMIT_TEST_DATABASE_URL"

// Container, when set before the first test asks for a database, is how
// pglaunch may start one in a container (the integration tests set it to a
// testcontainers-go launcher; the library's own tests leave it nil, so the
// library module does not depend on testcontainers).
var Container func(ctx context.Context) (url string, stop func(context.Context) error, err error)

var (
	once     sync.Once
	instance *pglaunch.Instance
	startErr error
	// inMain is set by Main: a server is started only under it, which
	// stops it.
	inMain bool
)

func start() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	instance, startErr = pglaunch.Start(ctx, pglaunch.Options{EnvVar: EnvVar, Container: Container})
}

// Main runs a test binary's tests (call it from TestMain) and stops the
// database they started, if any. m is a *testing.M, or anything that runs
// the tests as its Run method says (a suite run once per mode, say).
func Main(m interface{ Run() int }) {
	inMain = true
	code := m.Run()
	if instance != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := instance.Close(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testdb: stopping the database:", err)
		}
		cancel()
	}
	os.Exit(code)
}

// Instance returns the shared server, starting it on first use. Without one,
// the test fails when CI is set and is skipped, with the reason, elsewhere.
func Instance(t testing.TB) *pglaunch.Instance {
	t.Helper()
	if !inMain {
		t.Fatal("testdb: the test binary's TestMain must be testdb.Main(m), which stops the database the tests start")
	}
	once.Do(start)
	if startErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no PostgreSQL for the integration tests: %v", startErr)
		}
		t.Skipf("no PostgreSQL for the integration tests (set %s, or install PostgreSQL or Docker): %v", EnvVar, startErr)
	}
	return instance
}

// NewCluster starts a PostgreSQL cluster of the test's own from the installed
// server binaries, with the migrations applied to its postgres database, and
// removes it when the test ends: for tests that restart or crash the server.
// Without the binaries it fails when CI is set and skips elsewhere.
func NewCluster(t testing.TB, opts pglaunch.Options) *pglaunch.Instance {
	t.Helper()
	ctx := context.Background()
	in, err := pglaunch.StartLocal(ctx, opts)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("starting a PostgreSQL cluster: %v", err)
		}
		t.Skipf("no local PostgreSQL server binaries: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := in.Close(cctx); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	cfg, err := pgx.ParseConfig(in.URL)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrating: %v", err)
	}
	return in
}

// Schema is a fresh schema with pgratelimit's tables, dropped when the test
// ends.
type Schema struct {
	Name string
	// Config connects with search_path set to the schema.
	Config *pgxpool.Config
}

// NewSchema creates and migrates a schema of the test's own.
func NewSchema(t testing.TB) *Schema {
	t.Helper()
	s := newEmptySchema(t)
	db := stdlib.OpenDB(*s.Config.ConnConfig)
	defer db.Close()
	if err := migrations.Up(context.Background(), db); err != nil {
		t.Fatalf("migrating schema %s: %v", s.Name, err)
	}
	if os.Getenv(DistributeEnvVar) != "" {
		if err := migrations.Distribute(context.Background(), db); err != nil {
			t.Fatalf("distributing schema %s: %v", s.Name, err)
		}
	}
	return s
}

// DistributeEnvVar, when set, makes NewSchema distribute the tables by key
// (Citus): with EnvVar pointing at a Citus coordinator, the suite then runs
// on distributed tables.
const DistributeEnvVar = "PGRATELIMIT_TEST_DISTRIBUTE"

// NewEmptySchema creates a schema of the test's own without the tables.
func NewEmptySchema(t testing.TB) *Schema {
	t.Helper()
	return newEmptySchema(t)
}

func newEmptySchema(t testing.TB) *Schema {
	t.Helper()
	in := Instance(t)
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "test_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, in.URL)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, in.URL)
		if err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(in.URL)
	if err != nil {
		t.Fatalf("parsing the test database URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = name
	return &Schema{Name: name, Config: cfg}
}

// URL is a connection URL whose search_path is the schema.
func (s *Schema) URL(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(Instance(t).URL)
	if err != nil {
		t.Fatalf("parsing the test database URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", s.Name)
	u.RawQuery = q.Encode()
	return u.String()
}

// Pool opens a pool on the schema, closed when the test ends. maxConns 0
// keeps pgxpool's default.
func (s *Schema) Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := s.Config.Copy()
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PoolWithConfig opens a pool with cfg (a copy of s.Config, changed),
// closed when the test ends.
func (s *Schema) PoolWithConfig(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pool is NewSchema(t).Pool(t, 0): a pool on a fresh migrated schema.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewSchema(t).Pool(t, 0)
}

// Examples runs m (a test binary's tests and examples) with DATABASE_URL
// pointing at a fresh, migrated schema of the shared server, so that the
// package's examples (which read DATABASE_URL, as the README's code does,
// after its quick start has applied the migrations) run against a real
// database and their "Output:" is checked; the schema is dropped
// afterwards. Call it from TestMain: testdb.Main(testdb.Examples(m)). When
// no server can be had, DATABASE_URL is left as it is.
func Examples(m interface{ Run() int }) interface{ Run() int } { return examples{m} }

type examples struct{ m interface{ Run() int } }

func (e examples) Run() int {
	once.Do(start)
	if startErr != nil {
		return e.m.Run()
	}
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "examples_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, instance.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testdb: examples:", err)
		return 1
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		fmt.Fprintln(os.Stderr, "testdb: examples:", err)
		return 1
	}
	defer func() { _, _ = admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE") }()
	u, err := url.Parse(instance.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testdb: examples:", err)
		return 1
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	if err := migrate(ctx, u.String()); err != nil {
		fmt.Fprintln(os.Stderr, "testdb: examples:", err)
		return 1
	}
	old, had := os.LookupEnv("DATABASE_URL")
	os.Setenv("DATABASE_URL", u.String())
	defer func() {
		if had {
			os.Setenv("DATABASE_URL", old)
		} else {
			os.Unsetenv("DATABASE_URL")
		}
	}()
	return e.m.Run()
}

// migrate applies the migrations to the database at url.
func migrate(ctx context.Context, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Up(ctx, db)
}

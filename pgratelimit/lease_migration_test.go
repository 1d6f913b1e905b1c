package pgratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Migration 00009 moves the leases of 00007's tables into their keys' rows
// (made when missing), as the semaphore reads them, and its rollback moves
// them back.
func TestLeaseMigration(t *testing.T) {
	ctx := context.Background()
	pool := testdb.NewEmptySchema(t).Pool(t, 0)
	prov, err := migrations.NewProvider(stdlib.OpenDBFromPool(pool))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prov.UpTo(ctx, 8); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Key a has its lock row (as 00007's operations left it), b has none;
	// a has a live lease and one expired 10s ago with a TTL of a minute.
	exec(`INSERT INTO pgratelimit_buckets (prefix, key, tokens, refilled_at, expires_at)
VALUES ('m', 'a', 0, '0001-01-01', now() + interval '2 minutes')`)
	exec(`INSERT INTO pgratelimit_leases (prefix, key, id, weight, token, acquired_at, expires_at) VALUES
('m', 'a', 'live', 2, 7, now() - interval '10 seconds', now() + interval '50 seconds'),
('m', 'a', 'expired', 1, 5, now() - interval '70 seconds', now() - interval '10 seconds'),
('m', 'b', 'other', 1, 8, now(), now() + interval '1 minute')`)
	exec(`INSERT INTO pgratelimit_ephemeral_leases (prefix, key, id, weight, token, acquired_at, expires_at) VALUES
('m', 'a', 'eph', 1, 9, now(), now() + interval '1 minute')`)
	if _, err := prov.UpTo(ctx, 9); err != nil {
		t.Fatal(err)
	}

	s, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "m", Max: 2, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := s.Leases(ctx, "a")
	if err != nil || len(ls) != 1 || ls[0].ID != "live" || ls[0].Weight != 2 || ls[0].Token != 7 {
		t.Fatalf("leases of a after 00009: %+v, %v", ls, err)
	}
	if r, err := s.Acquire(ctx, "a", 1); err != nil || r.Allowed || r.Limit-r.Remaining != 2 {
		t.Fatalf("acquire on a full key: %+v, %v", r, err)
	}
	if err := s.Release(ctx, "a", "expired"); !errors.Is(err, pgratelimit.ErrLeaseExpired) {
		t.Fatalf("release of the lease expired 10s ago with a TTL of a minute: %v, want ErrLeaseExpired", err)
	}
	if ls, err := s.Leases(ctx, "b"); err != nil || len(ls) != 1 || ls[0].ID != "other" {
		t.Fatalf("leases of b, whose row 00009 made: %+v, %v", ls, err)
	}
	e, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "m", Max: 2, TTL: time.Minute, Storage: pgratelimit.Ephemeral})
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := e.Leases(ctx, "a"); err != nil || len(ls) != 1 || ls[0].ID != "eph" {
		t.Fatalf("ephemeral leases of a: %+v, %v", ls, err)
	}

	if _, err := prov.DownTo(ctx, 8); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgratelimit_leases) + (SELECT count(*) FROM pgratelimit_ephemeral_leases)`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("leases back in 00007's tables: %d, %v; want 4", n, err)
	}
}

package engine

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A statement that must change a count of rows (Stmt.Changes) fails its
// transaction when it changes another, on pgx and on database/sql: the
// array UPDATE finds rows by the ctids its locks read, and one that found
// no row must not pass for written.
func TestChangesCounted(t *testing.T) {
	ctx := context.Background()
	s := testdb.NewSchema(t)
	pool := s.Pool(t, 2)
	if _, err := pool.Exec(ctx, `INSERT INTO pgratelimit_buckets (prefix, key, tokens, refilled_at, expires_at)
VALUES ('p', 'a', 1, now(), now()), ('p', 'b', 1, now(), now())`); err != nil {
		t.Fatal(err)
	}
	var held tids
	for _, key := range []string{"a", "b"} {
		var tid pgtype.TID
		if err := pool.QueryRow(ctx, `SELECT ctid FROM pgratelimit_buckets WHERE prefix = 'p' AND key = $1`, key).Scan(&tid); err != nil {
			t.Fatal(err)
		}
		held = append(held, tid)
	}
	stale := tids{held[0], {BlockNumber: 1 << 20, OffsetNumber: 1, Valid: true}}
	update := func(ts tids) Stmt {
		return Stmt{SQL: Durable.Statements().Many.Update, Changes: int64(len(ts)),
			Args: []any{ts, int64s{5, 5}, times{{}, {}}, times{{}, {}}, int64s{10, 10}}}
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := (PgxExecutor{Q: tx}).Pipeline(ctx, []Stmt{update(held)}); err != nil {
		t.Fatalf("an UPDATE of the rows' ctids: %v", err)
	}
	if err := (PgxExecutor{Q: tx}).Pipeline(ctx, []Stmt{update(held)}); !errors.Is(err, errChanged) {
		t.Fatalf("an UPDATE of ctids the transaction moved since: %v, want errChanged", err)
	}
	if err := tx.Rollback(ctx); err != nil { // it holds row a
		t.Fatal(err)
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	ex := SQLExecutor{Tx: stx}
	arg := func(st Stmt) Stmt { // database/sql takes the arrays as literals
		for i, a := range st.Args {
			v, err := a.(interface {
				TextValue() (pgtype.Text, error)
			}).TextValue()
			if err != nil {
				t.Fatal(err)
			}
			st.Args[i] = v.String
		}
		return st
	}
	if err := ex.Pipeline(ctx, []Stmt{arg(update(stale))}); !errors.Is(err, errChanged) {
		t.Fatalf("database/sql, an UPDATE of a ctid of no row: %v, want errChanged", err)
	}
}

// An interval[] parameter (durations) reads back as the durations it was
// made of, in binary and as the array literal the exec and simple-protocol
// modes send; the longest horizon a policy may have included.
func TestIntervalLiteral(t *testing.T) {
	ctx := context.Background()
	pool := testdb.NewSchema(t).Pool(t, 1)
	want := durations{0, time.Microsecond, 90*time.Minute + time.Microsecond, 1000 * time.Hour, time.Duration(math.MaxInt64).Truncate(time.Microsecond)}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		var got []time.Duration
		if err := pool.QueryRow(ctx, "SELECT $1::interval[]", mode, want).Scan(&got); err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if !slices.Equal(got, []time.Duration(want)) {
			t.Errorf("mode %v: %v, want %v", mode, got, want)
		}
	}
}

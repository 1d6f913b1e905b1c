package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// migrationRow is a migration's state, as migrate prints it (and --json).
type migrationRow struct {
	Version   int64      `json:"version"`
	File      string     `json:"file"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func migrationStatus(ctx context.Context, db *sql.DB) ([]migrationRow, error) {
	st, err := migrations.Status(ctx, db)
	if err != nil {
		return nil, err
	}
	sort.Slice(st, func(i, j int) bool { return st[i].Source.Version < st[j].Source.Version })
	var rows []migrationRow
	for _, s := range st {
		r := migrationRow{Version: s.Source.Version, File: s.Source.Path, Applied: s.State == "applied"}
		if r.Applied {
			at := s.AppliedAt
			r.AppliedAt = &at
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// runMigrate is `pgratelimit migrate up|down|status|distribute`: it says
// what up or down changed, then prints every migration's state.
func runMigrate(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "migrate")
	yes := f.Bool("yes", false, "migrate down: roll back without asking (needed when stdin is not a terminal)")
	pos, err := f.parse(args, 1, 1)
	if err != nil {
		return f.fail(err)
	}
	action := pos[0]
	if action != "up" && action != "down" && action != "status" && action != "distribute" {
		return f.fail(usagef("unknown action %q: want up, down, status or distribute", action))
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	sctx, cancel := f.withTimeout(ctx)
	before, err := migrationStatus(sctx, db)
	cancel()
	if err != nil {
		return f.fail(err)
	}
	if action == "down" && !*yes {
		if err := f.confirmDown(before); err != nil {
			return f.fail(err)
		}
	}
	ctx, cancel = f.withTimeout(ctx) // (after the question, which may take a while)
	defer cancel()
	// What up or down did, in words: to stdout, or with --json (whose
	// stdout is the status) to stderr.
	say := c.stdout
	if f.json {
		say = c.stderr
	}
	switch {
	case action == "distribute":
		return f.distribute(ctx, db)
	case action == "up":
		err = migrations.Up(ctx, db)
	case action == "down" && slices.ContainsFunc(before, func(r migrationRow) bool { return r.Applied }):
		err = migrations.Down(ctx, db)
	case action == "down":
		fmt.Fprintln(say, "nothing to roll back: no migration is applied")
	}
	if err != nil {
		return f.fail(err)
	}
	after, err := migrationStatus(ctx, db)
	if err != nil {
		return f.fail(err)
	}
	if action != "status" {
		sayChanges(say, action, before, after)
	}
	if f.json {
		f.printJSON(after)
		return exitOK
	}
	if action != "status" {
		fmt.Fprintln(c.stdout)
	}
	for _, r := range after {
		state := "pending"
		if r.Applied {
			state = "applied " + r.AppliedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(c.stdout, "%05d %-32s %s\n", r.Version, r.File, state)
	}
	return exitOK
}

// confirmDown asks, on a terminal, before migrate down rolls back the
// last migration applied (if any), saying what it drops; without a
// terminal it refuses (--yes skips the question).
func (f *flags) confirmDown(rows []migrationRow) error {
	last := -1
	for i, r := range rows {
		if r.Applied {
			last = i
		}
	}
	if last < 0 {
		return nil // nothing to roll back: migrate says so
	}
	what := "rolls back " + rows[last].File
	if lost, ok := lostOnRollback[rows[last].Version]; ok {
		what += ": " + lost
	}
	if !f.c.terminal {
		return usagef("migrate down %s; give --yes to roll back without a terminal to confirm on", what)
	}
	fmt.Fprintf(f.c.stderr, "migrate down %s.\nRoll back? Type yes to go on: ", what)
	line, _ := bufio.NewReader(f.c.stdin).ReadString('\n')
	if strings.TrimSpace(line) != "yes" {
		return errors.New("not confirmed: nothing rolled back")
	}
	return nil
}

// distribute distributes the tables by key on Citus, and says which stay
// on the coordinator.
func (f *flags) distribute(ctx context.Context, db *sql.DB) int {
	if err := migrations.Distribute(ctx, db); err != nil {
		if errors.Is(err, migrations.ErrNoCitus) {
			return f.fail(explainf(err, "the citus extension is not installed in this database: run CREATE EXTENSION citus on the coordinator (and add the workers) first"))
		}
		return f.fail(err)
	}
	fmt.Fprintf(f.c.stdout, "distributed by key: %s\n", strings.Join([]string{sqlgen.DurableTable, sqlgen.EphemeralTable,
		sqlgen.GrantsTable, sqlgen.RequestsTable, sqlgen.LedgerTable, sqlgen.OverridesTable}, ", "))
	fmt.Fprintf(f.c.stdout, "on the coordinator: %s (usage alerts: consumers claim events across keys; policies: written once per process)\n",
		strings.Join([]string{sqlgen.AlertStateTable, sqlgen.EventsTable, sqlgen.PoliciesTable}, ", "))
	return exitOK
}

// lostOnRollback says, by version, what rolling a migration back throws
// away (its Down section, migrations/*.sql); versions missing here lose
// nothing but an index.
var lostOnRollback = map[int64]string{
	1: "the bucket tables and every bucket in them are dropped",
	3: "the grants table is dropped: every grant, and the credits left in them, are lost",
	4: "the ledger and the request IDs are dropped: every ledger entry is lost, and a charge retried with a request ID seen before would be charged again",
	6: "the ledger's grant expiries and plan changes and the request IDs of refunds and grants are deleted, the grants' part of every ledger entry " +
		"and the first outcomes remembered for request IDs are dropped, and the buckets forget the capacity they were written with",
	7:  "the leases tables are dropped: every lease is forgotten, so their units are free at once, and the fencing tokens start again from 1 after migrate up",
	8:  "the usage alerts' state and events are dropped: events not delivered yet are lost, and lines that fired this period fire again",
	10: "every key's override is dropped (its limiters' policy applies again at its next check) and the recorded policies are forgotten",
}

// sayChanges says which migrations up or down applied or rolled back, and
// what a rollback threw away.
func sayChanges(say io.Writer, action string, before, after []migrationRow) {
	changed := 0
	for i, r := range after {
		if i < len(before) && before[i].Applied != r.Applied {
			changed++
			lost, ok := lostOnRollback[r.Version]
			switch {
			case r.Applied:
				fmt.Fprintf(say, "applied %s\n", r.File)
			case ok:
				fmt.Fprintf(say, "rolled back %s: %s\n", r.File, lost)
			default:
				fmt.Fprintf(say, "rolled back %s\n", r.File)
			}
		}
	}
	if changed == 0 && action == "up" {
		fmt.Fprintf(say, "nothing to apply: all %d migrations are applied\n", len(after))
	}
}

// runCleanup is `pgratelimit cleanup`: delete the expired rows once, or
// every --every until interrupted, with a Cleaner (so a run skips while an
// application's Cleaner holds the schema's cleanup lock). Its count is over
// every table (expired leases included): the library does not count them
// by table. With --every it is Cleaner.Run's loop, with --timeout on each
// run: a run every D (plus up to a tenth of it, at random), said by the
// Cleaner's log on stderr (and with --json, a line per run on stdout).
func runCleanup(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "cleanup")
	every := f.Duration("every", 0, "run every D until interrupted (default: once)")
	batch := f.Int("batch-size", 1000, "rows per delete transaction")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer pool.Close()
	cfg := pgratelimit.CleanerConfig{Interval: *every, BatchSize: *batch}
	if *every > 0 {
		cfg.Logger = slog.New(slog.NewTextHandler(c.stderr, nil))
	}
	cl, err := pgratelimit.NewCleaner(pool, cfg)
	if err != nil {
		return f.fail(err)
	}
	for {
		rctx, cancel := f.withTimeout(ctx)
		start := time.Now()
		n, err := cl.RunOnce(rctx)
		cancel()
		took := time.Since(start)
		switch {
		case *every > 0 && ctx.Err() != nil:
			return exitOK
		case *every > 0:
			if f.json && err == nil {
				f.printJSON(map[string]any{"deleted": n, "ms": took.Milliseconds()})
			}
		case err != nil:
			return f.fail(err)
		case f.json:
			f.printJSON(map[string]any{"deleted": n, "ms": took.Milliseconds()})
			return exitOK
		default:
			fmt.Fprintf(c.stdout, "deleted %d expired rows in %s\n", n, took.Round(time.Millisecond))
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*every + time.Duration(mrand.Int64N(int64(*every)/10+1))):
		}
	}
}

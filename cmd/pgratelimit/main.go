// Command pgratelimit operates pgratelimit's buckets: apply the migrations,
// check, peek at, refund and reset keys, clean up expired rows, run a demo and
// a load benchmark.
//
// Run "pgratelimit help" for the commands, and "pgratelimit COMMAND --help"
// for each one's flags. Exit status: 0 allowed or done, 1 denied, 2 bad usage
// or an error.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

const (
	exitOK     = 0
	exitDenied = 1
	exitError  = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// cli is one invocation: its output streams and environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

type command struct {
	name, args, summary string
	run                 func(ctx context.Context, c *cli, args []string) int
}

var commands []command

func init() {
	commands = []command{
		{"migrate", "up|down|status", "apply, roll back (one step) or list the schema migrations", runMigrate},
		{"allow", "KEY [--cost N]", "check KEY and take its cost if allowed (exit 1 when denied)", runAllow},
		{"peek", "KEY", "show KEY's bucket without taking anything", runPeek},
		{"refund", "KEY N", "give N tokens back to KEY's bucket", runRefund},
		{"reset", "KEY", "make KEY's bucket full again", runReset},
		{"cleanup", "[--every D]", "delete expired rows, once or every D", runCleanup},
		{"demo", "[--addr A] [--once]", "serve a rate-limited HTTP app and send it 7 requests", runDemo},
		{"bench", "[flags]", "measure checks per second under load", runBench},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pgratelimit COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %-22s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintln(w, "\nThe database comes from --database-url or $DATABASE_URL. Run 'pgratelimit COMMAND --help' for flags.")
	fmt.Fprintln(w, "Exit status: 0 allowed or done, 1 denied, 2 bad usage or error.")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		usage(stderr)
		return exitError
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	}
	for _, cmd := range commands {
		if cmd.name == args[0] {
			return cmd.run(ctx, c, args[1:])
		}
	}
	fmt.Fprintf(stderr, "pgratelimit: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitError
}

// flags is a subcommand's flag set plus the options most share.
type flags struct {
	*flag.FlagSet
	cmd         command
	c           *cli
	databaseURL string
	json        bool
	prefix      string
	capacity    int64
	refill      int64
	interval    time.Duration
	storage     string
}

func newFlags(c *cli, name string) *flags {
	var cmd command
	for _, x := range commands {
		if x.name == name {
			cmd = x
		}
	}
	f := &flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), cmd: cmd, c: c}
	f.SetOutput(c.stderr)
	f.Usage = func() {
		fmt.Fprintf(f.Output(), "usage: pgratelimit %s %s\n\n%s.\n\nflags:\n", cmd.name, cmd.args, cmd.summary)
		f.PrintDefaults()
	}
	f.StringVar(&f.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
	f.BoolVar(&f.json, "json", false, "print JSON instead of text")
	return f
}

// withPolicy adds the limiter policy flags.
func (f *flags) withPolicy() *flags {
	f.StringVar(&f.prefix, "prefix", "default", "the limiter's key namespace (Config.Prefix)")
	f.Int64Var(&f.capacity, "capacity", 10, "most tokens a bucket holds (Config.Capacity)")
	f.Int64Var(&f.refill, "refill", 1, "tokens added every interval (Config.Refill)")
	f.DurationVar(&f.interval, "interval", time.Second, "the refill period (Config.Interval)")
	f.StringVar(&f.storage, "storage", "durable", "durable or ephemeral")
	return f
}

var errHelp = errors.New("help requested")

// parse parses flags and positional arguments in any order, and checks the
// number of positional arguments is between min and max.
func (f *flags) parse(args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, err
		}
		if f.NArg() == 0 {
			break
		}
		pos = append(pos, f.Arg(0))
		args = f.Args()[1:]
	}
	if len(pos) < minArgs || len(pos) > maxArgs {
		f.Usage()
		return nil, fmt.Errorf("wrong number of arguments: %d", len(pos))
	}
	return pos, nil
}

// fail reports err and returns the exit status for it.
func (f *flags) fail(err error) int {
	if errors.Is(err, errHelp) {
		return exitOK
	}
	fmt.Fprintf(f.c.stderr, "pgratelimit %s: %v\n", f.Name(), err)
	return exitError
}

func (f *flags) url() (string, error) {
	u := f.databaseURL
	if u == "" {
		u = f.c.getenv("DATABASE_URL")
	}
	if u == "" {
		return "", errors.New("no database: set --database-url or DATABASE_URL")
	}
	return u, nil
}

func (f *flags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	u, err := f.url()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	return pool, nil
}

func (f *flags) config() (pgratelimit.Config, error) {
	cfg := pgratelimit.Config{Prefix: f.prefix, Capacity: f.capacity, Refill: f.refill, Interval: f.interval}
	switch f.storage {
	case "durable":
		cfg.Storage = pgratelimit.Durable
	case "ephemeral":
		cfg.Storage = pgratelimit.Ephemeral
	default:
		return cfg, fmt.Errorf("--storage must be durable or ephemeral, got %q", f.storage)
	}
	return cfg, nil
}

func (f *flags) limiter(ctx context.Context) (*pgratelimit.Limiter, func(), error) {
	cfg, err := f.config()
	if err != nil {
		return nil, nil, err
	}
	pool, err := f.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := pgratelimit.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return l, pool.Close, nil
}

func (f *flags) printJSON(v any) {
	enc := json.NewEncoder(f.c.stdout)
	_ = enc.Encode(v)
}

type resultJSON struct {
	Key          string `json:"key"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
}

// printResult prints r and returns the exit status: 1 when denied.
func (f *flags) printResult(key string, r pgratelimit.Result) int {
	if f.json {
		f.printJSON(resultJSON{key, r.Allowed, r.Limit, r.Remaining, r.RetryAfter.Milliseconds(), r.ResetAfter.Milliseconds()})
	} else {
		verdict := "allowed"
		if !r.Allowed {
			verdict = "denied"
		}
		fmt.Fprintf(f.c.stdout, "%s: %q has %d of %d tokens", verdict, key, r.Remaining, r.Limit)
		if !r.Allowed {
			fmt.Fprintf(f.c.stdout, ", retry in %s", r.RetryAfter)
		}
		fmt.Fprintf(f.c.stdout, ", full in %s\n", r.ResetAfter)
	}
	if !r.Allowed {
		return exitDenied
	}
	return exitOK
}

// withLimiter runs a command that works on a limiter: it parses nargs
// positional arguments, opens the limiter and runs fn, which returns the exit
// status.
func (f *flags) withLimiter(ctx context.Context, args []string, nargs int, fn func(l *pgratelimit.Limiter, pos []string) (int, error)) int {
	pos, err := f.parse(args, nargs, nargs)
	if err != nil {
		return f.fail(err)
	}
	l, done, err := f.limiter(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer done()
	code, err := fn(l, pos)
	if err != nil {
		return f.fail(err)
	}
	return code
}

func runAllow(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "allow").withPolicy()
	cost := f.Int64("cost", 1, "tokens to take")
	return f.withLimiter(ctx, args, 1, func(l *pgratelimit.Limiter, pos []string) (int, error) {
		r, err := l.AllowN(ctx, pos[0], *cost)
		if err != nil {
			return 0, err
		}
		return f.printResult(pos[0], r), nil
	})
}

func runPeek(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "peek").withPolicy()
	return f.withLimiter(ctx, args, 1, func(l *pgratelimit.Limiter, pos []string) (int, error) {
		r, err := l.Peek(ctx, pos[0])
		if err != nil {
			return 0, err
		}
		f.printResult(pos[0], r)
		return exitOK, nil // peeking is never "denied"
	})
}

func runRefund(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "refund").withPolicy()
	return f.withLimiter(ctx, args, 2, func(l *pgratelimit.Limiter, pos []string) (int, error) {
		n, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("refund amount must be a whole number: %w", err)
		}
		r, err := l.Refund(ctx, pos[0], n)
		if err != nil {
			return 0, err
		}
		return f.printResult(pos[0], r), nil
	})
}

func runReset(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "reset").withPolicy()
	return f.withLimiter(ctx, args, 1, func(l *pgratelimit.Limiter, pos []string) (int, error) {
		if err := l.Reset(ctx, pos[0]); err != nil {
			return 0, err
		}
		if f.json {
			f.printJSON(map[string]any{"key": pos[0], "reset": true})
		} else {
			fmt.Fprintf(c.stdout, "reset: %q is full again\n", pos[0])
		}
		return exitOK, nil
	})
}

func runMigrate(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "migrate")
	pos, err := f.parse(args, 1, 1)
	if err != nil {
		return f.fail(err)
	}
	u, err := f.url()
	if err != nil {
		return f.fail(err)
	}
	db, err := sql.Open("pgx", u)
	if err != nil {
		return f.fail(err)
	}
	defer db.Close()
	switch pos[0] {
	case "up", "down":
		op := migrations.Up
		if pos[0] == "down" {
			op = migrations.Down
		}
		if err := op(ctx, db); err != nil {
			return f.fail(err)
		}
		fallthrough
	case "status":
		st, err := migrations.Status(ctx, db)
		if err != nil {
			return f.fail(err)
		}
		sort.Slice(st, func(i, j int) bool { return st[i].Source.Version < st[j].Source.Version })
		type row struct {
			Version   int64      `json:"version"`
			File      string     `json:"file"`
			Applied   bool       `json:"applied"`
			AppliedAt *time.Time `json:"applied_at,omitempty"`
		}
		var rows []row
		for _, s := range st {
			r := row{Version: s.Source.Version, File: s.Source.Path, Applied: s.State == "applied"}
			if r.Applied {
				at := s.AppliedAt
				r.AppliedAt = &at
			}
			rows = append(rows, r)
		}
		if f.json {
			f.printJSON(rows)
			return exitOK
		}
		for _, r := range rows {
			state := "pending"
			if r.Applied {
				state = "applied " + r.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(c.stdout, "%05d %-32s %s\n", r.Version, r.File, state)
		}
		return exitOK
	default:
		f.Usage()
		return f.fail(fmt.Errorf("unknown migrate action %q: want up, down or status", pos[0]))
	}
}

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
	if *every > 0 {
		cl, err := pgratelimit.NewCleaner(pool, pgratelimit.CleanerConfig{
			Interval:  *every,
			BatchSize: *batch,
			Logger:    slog.New(slog.NewTextHandler(c.stderr, nil)),
			OnRun: func(st pgratelimit.CleanupStats) {
				if f.json && st.Err == nil {
					f.printJSON(map[string]any{"deleted": st.Deleted, "batches": st.Batches, "ms": st.Duration.Milliseconds(), "skipped": st.Skipped})
				}
			},
		})
		if err != nil {
			return f.fail(err)
		}
		if err := cl.Run(ctx); err != nil {
			return f.fail(err)
		}
		return exitOK
	}
	start := time.Now()
	n, err := pgratelimit.DeleteExpired(ctx, pool, pgratelimit.CleanupOptions{BatchSize: *batch})
	if err != nil {
		return f.fail(err)
	}
	if f.json {
		f.printJSON(map[string]any{"deleted": n, "ms": time.Since(start).Milliseconds()})
	} else {
		fmt.Fprintf(c.stdout, "deleted %d expired rows in %s\n", n, time.Since(start).Round(time.Millisecond))
	}
	return exitOK
}

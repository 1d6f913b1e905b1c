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
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

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
	// timeout is the command's default --timeout, and timeoutUse its help
	// text when the command's database work is not one piece.
	timeout    time.Duration
	timeoutUse string
	// more is told after the flags in the command's help, if not empty.
	more string
}

// commands lists the commands, in the order usage shows them.
func commands() []command {
	return []command{
		{"migrate", "up|down|status|distribute", "apply, roll back (one step) or list the schema migrations; distribute the tables by key on Citus (after up)", runMigrate, 5 * time.Minute, "", ""},
		{"allow", "KEY [--cost N]", "check KEY and take its cost if allowed (exit 1 when denied; --request-id ID: once per ID)", runAllow, 10 * time.Second, "", ""},
		{"peek", "KEY", "show KEY's bucket without taking anything", runPeek, 10 * time.Second, "", ""},
		{"refund", "KEY N", "give N tokens back to KEY's bucket", runRefund, 10 * time.Second, "", ""},
		{"grant", "KEY N [--expires T]", "grant KEY N credits beyond its bucket, spent after it (until T)", runGrant, 10 * time.Second, "", ""},
		{"balance", "KEY", "show KEY's bucket and each of its live grants", runBalance, 10 * time.Second, "", ""},
		{"settle", "KEY --request-id ID --actual N", "bring the charge of request ID to its actual cost N", runSettle, 10 * time.Second, "", ""},
		{"ledger", "KEY [--since T]", "list KEY's ledger: charges, refunds, grants, settlements, debits, resets", runLedger, 10 * time.Second, "", ""},
		{"reset", "KEY", "make KEY's bucket full again", runReset, 10 * time.Second, "", ""},
		{"cleanup", "[--every D]", "delete expired rows, once or every D", runCleanup, 5 * time.Minute,
			"give up on a cleanup run (each run, with --every) after D; 0: never", ""},
		{"demo", "[--addr A] [--once]", "serve a rate-limited HTTP app and a page to try it on", runDemo, 10 * time.Second,
			"give up on the database work of the set-up and of each request after D; 0: never", ""},
		{"bench", "[flags]", "measure checks per second under load", runBench, time.Minute,
			"give up on setting up and removing the scratch schema after D (the run itself lasts --duration); 0: never", benchMore},
	}
}

// lookupCommand returns the command called name.
func lookupCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: pgratelimit COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %-22s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintln(w, "\nThe database comes from --database-url or $DATABASE_URL. Every command gives up")
	fmt.Fprintf(w, "connecting after --connect-timeout (default %s) and its database work after\n", defaultConnectTimeout)
	fmt.Fprintln(w, "--timeout (default 10s for allow, peek, refund, reset, grant and balance; 0: never).")
	fmt.Fprintln(w, "Run 'pgratelimit COMMAND --help' for its flags.")
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
		if len(args) == 2 && args[0] == "help" {
			return run(ctx, []string{args[1], "--help"}, stdout, stderr, getenv)
		}
		usage(stdout)
		return exitOK
	}
	if cmd, ok := lookupCommand(args[0]); ok {
		return cmd.run(ctx, c, args[1:])
	}
	fmt.Fprintf(stderr, "pgratelimit: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitError
}

// withLimiter runs a command that works on a limiter: it parses nargs
// positional arguments, runs check on them (if not nil), opens the limiter
// and runs fn, which returns the exit status.
func (f *flags) withLimiter(ctx context.Context, args []string, nargs int, check func(pos []string) error, fn func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error)) int {
	pos, err := f.parse(args, nargs, nargs)
	if err != nil {
		return f.fail(err)
	}
	if check != nil {
		if err := check(pos); err != nil {
			return f.fail(err)
		}
	}
	l, done, err := f.limiter(ctx)
	if err != nil {
		return f.fail(err)
	}
	defer done()
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
	code, err := fn(ctx, l, pos)
	if err != nil {
		return f.fail(err)
	}
	return code
}

// resultJSON is a check's, a peek's or a refund's result for --json. Allowed
// is only a check's; Cost and Refunded say what was asked.
type resultJSON struct {
	Key          string `json:"key"`
	Allowed      *bool  `json:"allowed,omitempty"`
	Cost         int64  `json:"cost,omitempty"`
	Refunded     int64  `json:"refunded,omitempty"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	Granted      int64  `json:"granted"`
	RequestID    string `json:"request_id,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	ResetAfterMS int64  `json:"reset_after_ms"`
}

func newResultJSON(key string, r pgratelimit.Result) resultJSON {
	return resultJSON{Key: key, Limit: r.Limit, Remaining: r.Remaining, Granted: r.Granted, RetryAfterMS: r.RetryAfter.Milliseconds(), ResetAfterMS: r.ResetAfter.Milliseconds()}
}

// human formats a wait for people: to the millisecond below 10s, else to the
// second, always rounded up (a wait shown is never shorter than the truth).
func human(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	unit := time.Second
	if d < 10*time.Second {
		unit = time.Millisecond
	}
	if r := d % unit; r != 0 {
		d += unit - r
	}
	return d.String()
}

// grantedText mentions a key's grants, if it has any.
func grantedText(r pgratelimit.Result) string {
	if r.Granted == 0 {
		return ""
	}
	return fmt.Sprintf(" and %d granted", r.Granted)
}

// retryText says when a denied check may succeed.
func retryText(r pgratelimit.Result) string {
	if r.RetryAfter == pgratelimit.InfDuration {
		return "refills alone will never cover it (grant more)"
	}
	return "retry in " + human(r.RetryAfter)
}

// fullness says when a bucket is full again.
func fullness(r pgratelimit.Result) string {
	if r.Remaining >= r.Limit {
		return "full"
	}
	return "full in " + human(r.ResetAfter)
}

func plural(n int64, one, many string) string {
	if n == 1 || n == -1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func runAllow(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "allow").withPolicy()
	cost := f.Int64("cost", 1, "tokens to take")
	requestID := f.String("request-id", "", "an idempotency key: a repeat with the same ID prints the first outcome and charges nothing")
	check := func([]string) error {
		switch {
		case *cost < 1:
			return usagef("--cost must be at least 1, got %d", *cost)
		case *cost > f.capacity && f.capacity > 0:
			// (A limiter with Config.Grants allows such a cost when grants
			// cover it; the CLI keeps its checks within the bucket.)
			return usagef("--cost %d is more than the bucket's capacity (--capacity %d): such a check could never be allowed", *cost, f.capacity)
		}
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		if *requestID != "" {
			ctx = pgratelimit.WithRequestID(ctx, *requestID)
		}
		r, err := l.AllowN(ctx, key, *cost)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := newResultJSON(key, r)
			j.Allowed, j.Cost, j.RequestID = &r.Allowed, *cost, *requestID
			f.printJSON(j)
		} else if r.Allowed {
			fmt.Fprintf(c.stdout, "allowed: took %s from %q: %d of %d left%s, %s\n",
				plural(*cost, "token", "tokens"), key, r.Remaining, r.Limit, grantedText(r), fullness(r))
		} else {
			fmt.Fprintf(c.stdout, "denied: %q has %d of %d tokens%s, not the %d asked for (nothing taken); %s\n",
				key, r.Remaining, r.Limit, grantedText(r), *cost, retryText(r))
		}
		if !r.Allowed {
			return exitDenied, nil
		}
		return exitOK, nil
	})
}

func runPeek(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "peek").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		switch {
		case f.json:
			f.printJSON(newResultJSON(key, r))
		case r.Remaining >= r.Limit:
			fmt.Fprintf(c.stdout, "%q has %d of %d tokens (full)\n", key, r.Remaining, r.Limit)
		case r.Remaining == 0:
			fmt.Fprintf(c.stdout, "%q has 0 of %d tokens (empty): next token in %s, full in %s\n", key, r.Limit, human(r.RetryAfter), human(r.ResetAfter))
		default:
			fmt.Fprintf(c.stdout, "%q has %d of %d tokens, full in %s\n", key, r.Remaining, r.Limit, human(r.ResetAfter))
		}
		return exitOK, nil // peeking checks nothing, so it is never "denied"
	})
}

func runRefund(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "refund").withPolicy()
	var n int64
	check := func(pos []string) error {
		var err error
		n, err = strconv.ParseInt(pos[1], 10, 64)
		switch {
		case err != nil:
			return usagef("N, the tokens to give back, must be a whole number, got %q", pos[1])
		case n < 1:
			return usagef("N, the tokens to give back, must be at least 1, got %d (allow KEY --cost N takes tokens)", n)
		}
		return nil
	}
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Refund(ctx, key, n)
		if err != nil {
			return 0, err
		}
		switch {
		case f.json:
			j := newResultJSON(key, r)
			j.Refunded = n
			f.printJSON(j)
		case r.Remaining >= r.Limit:
			fmt.Fprintf(c.stdout, "refunded: %q is full, %d of %d tokens (a refund never fills a bucket past its capacity)\n", key, r.Remaining, r.Limit)
		default:
			fmt.Fprintf(c.stdout, "refunded %s to %q: it has %d of %d tokens, %s\n", plural(n, "token", "tokens"), key, r.Remaining, r.Limit, fullness(r))
		}
		return exitOK, nil
	})
}

func runReset(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "reset").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		if err := l.Reset(ctx, pos[0]); err != nil {
			return 0, err
		}
		if f.json {
			f.printJSON(map[string]any{"key": pos[0], "reset": true})
		} else {
			fmt.Fprintf(c.stdout, "reset: %q is full again (%d tokens)\n", pos[0], f.capacity)
		}
		return exitOK, nil
	})
}

func runGrant(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "grant").withPolicy()
	expires := f.String("expires", "", "when the grant expires: an RFC 3339 time, a date (midnight UTC), or a duration from now such as 720h (default: never)")
	var n int64
	var until time.Time
	check := func(pos []string) error {
		var err error
		n, err = strconv.ParseInt(pos[1], 10, 64)
		switch {
		case err != nil:
			return usagef("N, the credits to grant, must be a whole number, got %q", pos[1])
		case n < 1:
			return usagef("N, the credits to grant, must be at least 1, got %d", n)
		case !f.grants():
			return usagef("grants are kept for durable storage only (--storage durable)")
		}
		until, err = parseExpiry(*expires, time.Now())
		return err
	}
	return f.withLimiter(ctx, args, 2, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		g, err := l.Grant(ctx, key, n, until)
		if err != nil {
			return 0, err
		}
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		if f.json {
			f.printJSON(map[string]any{"key": key, "grant": grantJSONOf(g), "granted": r.Granted, "remaining": r.Remaining, "limit": r.Limit})
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "granted %d to %q (grant %d, %s): %d granted in all, %d of %d in the bucket\n",
			n, key, g.ID, expiryText(g.ExpiresAt), r.Granted, r.Remaining, r.Limit)
		return exitOK, nil
	})
}

func runBalance(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "balance").withPolicy()
	return f.withLimiter(ctx, args, 1, nil, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Peek(ctx, key)
		if err != nil {
			return 0, err
		}
		var gs []pgratelimit.Grant
		if f.grants() {
			if gs, err = l.Grants(ctx, key); err != nil {
				return 0, err
			}
		}
		if f.json {
			j := struct {
				resultJSON
				Grants []grantJSON `json:"grants"`
			}{newResultJSON(key, r), []grantJSON{}}
			for _, g := range gs {
				j.Grants = append(j.Grants, grantJSONOf(g))
			}
			f.printJSON(j)
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "%q: %d of %d tokens in the bucket (%s); %d granted in %s\n",
			key, r.Remaining, r.Limit, fullness(r), r.Granted, plural(int64(len(gs)), "live grant", "live grants"))
		for _, g := range gs {
			fmt.Fprintf(c.stdout, "  grant %d: %d left, %s (granted %s)\n", g.ID, g.Amount, expiryText(g.ExpiresAt), g.GrantedAt.UTC().Format(time.RFC3339))
		}
		return exitOK, nil
	})
}

// grantJSON is a grant for --json.
type grantJSON struct {
	ID        int64      `json:"id"`
	Amount    int64      `json:"amount"`
	ExpiresAt *time.Time `json:"expires_at"` // null: never
	GrantedAt time.Time  `json:"granted_at"`
}

func grantJSONOf(g pgratelimit.Grant) grantJSON {
	j := grantJSON{ID: g.ID, Amount: g.Amount, GrantedAt: g.GrantedAt.UTC()}
	if !g.ExpiresAt.IsZero() {
		t := g.ExpiresAt.UTC()
		j.ExpiresAt = &t
	}
	return j
}

func runSettle(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "settle").withPolicy()
	requestID := f.String("request-id", "", "the request ID of the estimate's check (required)")
	actual := f.Int64("actual", -1, "the actual cost (required; 0 or more)")
	check := func([]string) error {
		switch {
		case *requestID == "":
			return usagef("--request-id is required: the ID the estimate was taken with (allow --request-id)")
		case *actual < 0:
			return usagef("--actual is required: the actual cost, 0 or more")
		}
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		key := pos[0]
		r, err := l.Settle(ctx, key, *requestID, *actual)
		if err != nil {
			return 0, err
		}
		if f.json {
			j := newResultJSON(key, r)
			j.RequestID = *requestID
			f.printJSON(j)
			return exitOK, nil
		}
		fmt.Fprintf(c.stdout, "settled request %q of %q at %d: %d of %d tokens%s%s\n",
			*requestID, key, *actual, r.Remaining, r.Limit, grantedText(r), debtText(r))
		return exitOK, nil
	})
}

func debtText(r pgratelimit.Result) string {
	if r.Remaining >= 0 {
		return ""
	}
	return fmt.Sprintf(" (a debt of %d: checks are denied until refills or grants repay it)", -r.Remaining)
}

func runLedger(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "ledger").withPolicy()
	since := f.String("since", "", "only entries at or after T: an RFC 3339 time, a date, or a duration before now such as 24h (default: all)")
	var from time.Time
	check := func([]string) error {
		if *since == "" {
			return nil
		}
		if d, err := time.ParseDuration(*since); err == nil && d > 0 {
			from = time.Now().Add(-d)
			return nil
		}
		t, err := parseExpiry(*since, time.Now())
		if err != nil {
			return usagef("--since must be an RFC 3339 time, a date or a duration, got %q", *since)
		}
		from = t
		return nil
	}
	return f.withLimiter(ctx, args, 1, check, func(ctx context.Context, l *pgratelimit.Limiter, pos []string) (int, error) {
		es, err := l.Ledger(ctx, pos[0], from)
		if err != nil {
			return 0, err
		}
		if f.json {
			type entry struct {
				ID        int64     `json:"id"`
				At        time.Time `json:"at"`
				Amount    int64     `json:"amount"`
				Kind      string    `json:"kind"`
				RequestID string    `json:"request_id,omitempty"`
				Balance   int64     `json:"balance"`
			}
			out := []entry{}
			for _, e := range es {
				out = append(out, entry{e.ID, e.At.UTC(), e.Amount, e.Kind, e.RequestID, e.Balance})
			}
			f.printJSON(out)
			return exitOK, nil
		}
		if len(es) == 0 {
			fmt.Fprintf(c.stdout, "%q has no ledger entries (the ledger records limiters with Config.Ledger and the CLI's durable checks)\n", pos[0])
		}
		for _, e := range es {
			line := fmt.Sprintf("%s  %-6s %+d  balance %d", e.At.UTC().Format(time.RFC3339Nano), e.Kind, e.Amount, e.Balance)
			if e.RequestID != "" {
				line += "  request " + strconv.Quote(e.RequestID)
			}
			fmt.Fprintln(c.stdout, line)
		}
		return exitOK, nil
	})
}

func expiryText(t time.Time) string {
	if t.IsZero() {
		return "never expires"
	}
	return "expires " + t.UTC().Format(time.RFC3339)
}

// parseExpiry reads --expires: an RFC 3339 time, a date (midnight UTC), or
// a duration after now; "" is never.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(d), nil
	}
	return time.Time{}, usagef("--expires must be an RFC 3339 time (2027-01-31T00:00:00Z), a date (2027-01-31) or a positive duration (720h), got %q", s)
}

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

func runMigrate(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "migrate")
	pos, err := f.parse(args, 1, 1)
	if err != nil {
		return f.fail(err)
	}
	action := pos[0]
	if action != "up" && action != "down" && action != "status" && action != "distribute" {
		return f.fail(usagef("unknown action %q: want up, down, status or distribute", action))
	}
	cfg, err := f.connConfig()
	if err != nil {
		return f.fail(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
	before, err := migrationStatus(ctx, db)
	if err != nil {
		return f.fail(err)
	}
	// What up or down did, in words: to stdout, or with --json (whose
	// stdout is the status) to stderr.
	say := c.stdout
	if f.json {
		say = c.stderr
	}
	switch action {
	case "distribute":
		if err := migrations.Distribute(ctx, db); err != nil {
			if errors.Is(err, migrations.ErrNoCitus) {
				return f.fail(errors.New("the citus extension is not installed in this database: run CREATE EXTENSION citus on the coordinator (and add the workers) first"))
			}
			return f.fail(err)
		}
		fmt.Fprintf(c.stdout, "distributed by key: %s, %s\n", pgratelimit.DurableTable, pgratelimit.EphemeralTable)
		return exitOK
	case "up":
		if err := migrations.Up(ctx, db); err != nil {
			return f.fail(err)
		}
	case "down":
		applied := 0
		for _, r := range before {
			if r.Applied {
				applied++
			}
		}
		if applied == 0 {
			fmt.Fprintln(say, "nothing to roll back: no migration is applied")
			break
		}
		if err := migrations.Down(ctx, db); err != nil {
			return f.fail(err)
		}
	}
	after, err := migrationStatus(ctx, db)
	if err != nil {
		return f.fail(err)
	}
	if action != "status" {
		changed := 0
		for i, r := range after {
			if i < len(before) && before[i].Applied != r.Applied {
				changed++
				if r.Applied {
					fmt.Fprintf(say, "applied %s\n", r.File)
				} else if i == 0 {
					fmt.Fprintf(say, "rolled back %s: the bucket tables and every bucket in them are dropped\n", r.File)
				} else {
					fmt.Fprintf(say, "rolled back %s\n", r.File)
				}
			}
		}
		if changed == 0 && action == "up" {
			fmt.Fprintf(say, "nothing to apply: all %d migrations are applied\n", len(after))
		}
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
		})
		if err != nil {
			return f.fail(err)
		}
		// Cleaner.Run's loop, with --timeout on each run.
		for {
			rctx, cancel := f.withTimeout(ctx)
			st := cl.RunOnce(rctx)
			cancel()
			if ctx.Err() != nil {
				return exitOK
			}
			if f.json && st.Err == nil {
				f.printJSON(map[string]any{"deleted": st.Deleted, "batches": st.Batches, "ms": st.Duration.Milliseconds(), "skipped": st.Skipped})
			}
			jitter := time.Duration(mrand.Int64N(int64(*every)/10 + 1))
			select {
			case <-ctx.Done():
				return exitOK
			case <-time.After(*every + jitter):
			}
		}
	}
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
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

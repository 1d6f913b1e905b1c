package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/stretchr/testify/require"
)

// cliEnv makes the test binary run the CLI's main instead of the tests, for
// tests that need a process of its own (signals).
const cliEnv = "PGRATELIMIT_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		main()
	}
	testdb.Main(m)
}

// startCLI runs the CLI as a process of its own with DATABASE_URL set to
// url, and returns it with its stdout, read line by line.
func startCLI(t *testing.T, url string, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), cliEnv+"=1", "DATABASE_URL="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, bufio.NewScanner(out)
}

// databaseURL is an environment with DATABASE_URL set to url, and nothing
// else.
func databaseURL(url string) func(string) string {
	return func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
}

// pgrl runs the CLI in-process with DATABASE_URL set to url.
func pgrl(url string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	getenv := databaseURL(url)
	// Not a terminal, whatever the test's stdin is: nothing asks.
	code = runCLI(context.Background(), &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: getenv}, args)
	return code, out.String(), errOut.String()
}

func TestCommands(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptySchema(t).URL(t)

	code, _, stderr := pgrl(url, "allow", "k")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "migrate", "before migrating, the error says what to do")

	code, out, _ := pgrl(url, "migrate", "up")
	require.Equal(t, 0, code)
	require.Regexp(t, `00001_create_buckets\.sql\s+applied`, out)
	require.Regexp(t, `00002_index_expires_at\.sql\s+applied`, out)

	policy := []string{"--prefix", "cli", "--capacity", "3", "--refill", "1", "--interval", "1h"}
	code, out, _ = pgrl(url, append([]string{"allow", "user-1", "--cost", "2"}, policy...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `allowed: took 2 tokens from "user-1": 1 of 3 left`)

	code, out, _ = pgrl(url, append([]string{"allow", "--json", "--cost", "2", "user-1"}, policy...)...)
	require.Equal(t, 1, code, "denied exits 1")
	var res struct {
		Allowed      bool  `json:"allowed"`
		Remaining    int64 `json:"remaining"`
		RetryAfterMS int64 `json:"retry_after_ms"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.False(t, res.Allowed)
	require.Equal(t, int64(1), res.Remaining)
	require.Positive(t, res.RetryAfterMS)

	code, out, _ = pgrl(url, append([]string{"peek", "user-1"}, policy...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "has 1 of 3 tokens")

	code, out, _ = pgrl(url, append([]string{"refund", "user-1", "1"}, policy...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "has 2 of 3 tokens")

	code, _, _ = pgrl(url, append([]string{"reset", "user-1"}, policy...)...)
	require.Equal(t, 0, code)
	code, out, _ = pgrl(url, append([]string{"peek", "user-1", "--json"}, policy...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":3`)

	code, out, _ = pgrl(url, "cleanup")
	require.Equal(t, 0, code)
	require.Contains(t, out, "deleted 0 expired rows")

	code, out, _ = pgrl(url, "migrate", "status", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"applied":true`)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: pgratelimit COMMAND"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"allow"}, "missing KEY"},
		{[]string{"allow", "a", "b"}, "too many arguments"},
		{[]string{"allow", "k", "--cost", "many"}, `--cost wants a whole number, got "many"`},
		{[]string{"allow", "k", "--cost"}, "--cost needs a value"},
		{[]string{"allow", "k", "--cost", "0"}, "--cost: invalid cost: 0 is below 1"},
		{[]string{"allow", "k", "--cost", "11", "--storage", "ephemeral"}, "--cost: cost exceeds capacity: cost 11, capacity 10"},
		{[]string{"bench", "--commit", "later"}, `--commit must be sync or async, got "later"`},
		{[]string{"bench", "--commit", "async", "--grants", "5"}, "--commit async with Grants or Ledger: credits and their ledger must survive a crash"},
		{[]string{"bench", "--commit", "async", "--request-ids"}, "--commit async does not go with --request-ids"},
		{[]string{"bench", "--deny-cache", "-1"}, "--deny-cache must be >= 0, got -1"},
		{[]string{"allow", "k", "--capacity", "0"}, "--capacity must be > 0, got 0"},
		{[]string{"allow", "k", "--interval", "1x"}, "--interval wants a duration"},
		{[]string{"allow", "k", "--every", "day", "--interval", "2s"}, "--interval and Calendar are both set (Interval 2s, Calendar every day)"},
		{[]string{"grant", "k", "5", "--storage", "ephemeral"}, "whose limiter has Config.Grants off"},
		{[]string{"allow", "k", "--storage", "floppy"}, "--storage must be durable or ephemeral"},
		{[]string{"allow", ""}, "invalid key: key must not be empty"},
		{[]string{"refund", "k", "x"}, `N, the tokens to give back, must be a whole number, got "x"`},
		{[]string{"refund", "k"}, "missing N"},
		{[]string{"cleanup", "now"}, `unexpected argument "now"`},
		{[]string{"migrate", "sideways"}, `unknown action "sideways": want up, down, status or distribute`},
		{[]string{"bench", "--mode", "turbo"}, "--mode must be"},
		{[]string{"bench", "--alerts", "--storage", "ephemeral"}, "--alerts need Storage Durable"},
		{[]string{"bench", "--leases", "--grants", "5", "--ledger"}, "--leases does not go with --grants, --ledger: they set up checks of buckets"},
		{[]string{"bench", "--leases", "--alerts"}, "--leases does not go with --alerts"},
		{[]string{"bench", "--leases", "--lease-max", "2", "--cost", "3"}, "--cost 3, the weight of each lease, is more than --lease-max 2"},
		{[]string{"events", "--limit", "0"}, "--limit must be between 1 and 10000, got 0"},
		{[]string{"events", "--since", "soon"}, `--since must be an RFC 3339 time, a date or a duration, got "soon"`},
		{[]string{"events", "k"}, `unexpected argument "k": events takes only flags`},
		{[]string{"settle"}, "pgratelimit settle: missing KEY\n"},
		{[]string{"acquire", "k", "--ttl", "1s"}, "--max is required: the most units a key's live leases hold (SemaphoreConfig.Max)"},
		{[]string{"acquire", "k", "--max", "2"}, "--ttl is required: how long a lease counts unless extended, such as 30s"},
		{[]string{"acquire", "k", "--max", "0", "--ttl", "1s"}, "--max must be > 0, got 0"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "0s"}, "--ttl must be > 0 and a whole number of microseconds, got 0s"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1ns"}, "--ttl must be > 0 and a whole number of microseconds, got 1ns"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1s", "--weight", "0"}, "--weight: invalid cost: weight 0 is below 1"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1s", "--weight", "3"}, "--weight: cost exceeds capacity: weight 3, Max 2"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1s", "--request-id", strings.Repeat("x", 257)}, "--request-id: invalid request ID: is 257 bytes, longer than 256"},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1s", "--storage", "floppy"}, `--storage must be durable or ephemeral, got "floppy"`},
		{[]string{"acquire", "k", "--max", "2", "--ttl", "1s", "--prefix", ""}, "--prefix must not be empty"},
		{[]string{"acquire", "", "--max", "2", "--ttl", "1s"}, "invalid key: key must not be empty"},
		{[]string{"acquire", "--max", "2", "--ttl", "1s"}, "pgratelimit acquire: missing KEY\n"},
		{[]string{"release", "k"}, "pgratelimit release: missing LEASE-ID\n"},
		{[]string{"release", "", "x"}, "invalid key: key must not be empty"},
		{[]string{"release", "k", "x", "--max", "0"}, "--max must be > 0, got 0"},
		{[]string{"extend"}, "pgratelimit extend: missing KEY and LEASE-ID\n"},
		{[]string{"extend", "k", "x"}, "--ttl is required: how long the lease counts from now, such as 30s"},
		{[]string{"extend", "k", "", "--ttl", "1s"}, "LEASE-ID: invalid request ID: must not be empty"},
		{[]string{"extend", "k", "\xff", "--ttl", "1s"}, "LEASE-ID: invalid request ID: is not valid UTF-8"},
		{[]string{"leases", "k", "--max", "-1"}, "--max must be > 0, got -1"},
		{[]string{"leases", "k", "x"}, "too many arguments: leases takes 1 (KEY [--max N]), got 2"},
		{[]string{"leases", ""}, "invalid key: key must not be empty"},
	} {
		// The URL points nowhere: none of these may reach a database.
		code, _, stderr := pgrl("postgres://nobody@127.0.0.1:1/x?connect_timeout=1", tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, _, stderr := pgrl("", "peek", "k")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "DATABASE_URL")
	for _, cmd := range commands() {
		code, stdout, _ := pgrl("", cmd.name, "--help")
		require.Equal(t, 0, code, cmd.name)
		require.Contains(t, stdout, "usage: pgratelimit "+cmd.name, cmd.name)
	}
	code, stdout, _ := pgrl("", "help")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "commands:")
}

var statusLine = regexp.MustCompile(`(?m)^request (\d): (\d{3}) `)

func checkDemo(t *testing.T, out string) {
	t.Helper()
	var statuses []string
	for _, m := range statusLine.FindAllStringSubmatch(out, -1) {
		statuses = append(statuses, m[2])
	}
	require.Equal(t, []string{"200", "200", "200", "200", "200", "429", "429"}, statuses, out)
	require.Contains(t, out, `RateLimit: "demo";r=4;t=1`)
	require.Contains(t, out, "Retry-After: 1")
	require.Contains(t, out, `RateLimit-Policy: "demo";q=5;w=5`)
}

// demo --once against a database from DATABASE_URL, twice: a re-run starts
// with a full bucket again.
func TestDemoWithDatabaseURL(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptySchema(t).URL(t)
	for range 2 {
		code, out, stderr := pgrl(url, "demo", "--once", "--addr", "127.0.0.1:0")
		require.Equal(t, 0, code, stderr)
		checkDemo(t, out)
		require.NotContains(t, out, "throwaway")
	}
}

// demo --once with no DATABASE_URL starts, and removes, its own PostgreSQL:
// what `make demo` does on a fresh machine.
func TestDemoThrowawayDatabase(t *testing.T) {
	t.Parallel()
	testdb.Instance(t) // skipped (or failed in CI) like the rest when no PostgreSQL can be had
	code, out, stderr := pgrl("", "demo", "--once", "--addr", "127.0.0.1:0")
	require.Equal(t, 0, code, stderr)
	checkDemo(t, out)
	require.Contains(t, out, "starting a throwaway PostgreSQL")
	require.Regexp(t, `(?m)^Started PostgreSQL \d+\.\d+, removed when the demo stops: DATABASE_URL=postgres://postgres@127\.0\.0\.1:\d+/postgres$`, out,
		"the URL, for the CLI")
	require.Contains(t, out, "Stopped and removed")
	require.False(t, strings.Contains(stderr, "ERROR"), stderr)
}

// Every message says what happened in the user's terms (the issue "The CLI's
// words"), one case per complaint.
func TestMessages(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "words", "--capacity", "3", "--refill", "1", "--interval", "1h"}
	with := func(args ...string) []string { return append(args, policy...) }

	t.Run("peek on an empty bucket is not a denial", func(t *testing.T) {
		code, out, _ := pgrl(url, with("allow", "empty", "--cost", "3")...)
		require.Equal(t, 0, code, out)
		code, out, _ = pgrl(url, with("peek", "empty")...)
		require.Equal(t, 0, code, "peeking checks nothing, so it never exits 1")
		require.NotContains(t, out, "denied")
		require.NotContains(t, out, "allowed")
		require.Regexp(t, `^"empty" has 0 of 3 tokens \(empty\): next token in (\d+m|\d+m \d+s|[\d.]+m?s), full in [23]h( \d+m)?\n$`, out, "(seconds just before the hour; the hour just after it)")

		code, out, _ = pgrl(url, with("peek", "never-seen")...)
		require.Equal(t, 0, code)
		require.Equal(t, "\"never-seen\" has 3 of 3 tokens (full)\n", out)

		code, out, _ = pgrl(url, with("peek", "empty", "--json")...)
		require.Equal(t, 0, code)
		require.NotContains(t, out, `"allowed"`, "a peek has no verdict")
		require.Contains(t, out, `"remaining":0`)
	})

	t.Run("refund is not a check", func(t *testing.T) {
		code, out, _ := pgrl(url, with("allow", "ref", "--cost", "3")...)
		require.Equal(t, 0, code, out)
		code, out, _ = pgrl(url, with("refund", "ref", "1")...)
		require.Equal(t, 0, code)
		require.NotContains(t, out, "allowed")
		require.Regexp(t, `^refunded 1 token to "ref": it has 1 of 3 tokens, full in (1h \d+m|2h|[\d.]+m?s|\d+m( \d+s)?)\n$`, out)
		code, out, _ = pgrl(url, with("refund", "ref", "5")...)
		require.Equal(t, 0, code)
		require.Equal(t, "refunded: \"ref\" is full, 3 of 3 tokens (a refund never fills a bucket past its capacity)\n", out)
	})

	t.Run("a denial says why and what was taken", func(t *testing.T) {
		code, _, _ := pgrl(url, with("allow", "den", "--cost", "2")...)
		require.Equal(t, 0, code)
		code, out, _ := pgrl(url, with("allow", "den", "--cost", "2")...)
		require.Equal(t, 1, code)
		require.Regexp(t, `^denied: "den" has 1 of 3 tokens, not the 2 asked for \(nothing taken\); retry in (\d+m( \d+s)?|[\d.]+m?s)\n$`, out, "(seconds just before the hour)")
	})

	t.Run("errors name the command once", func(t *testing.T) {
		for _, args := range [][]string{
			with("allow", "k", "--cost", "0"),
			append(with("allow", "k", "--cost", "4"), "--storage", "ephemeral"),
			with("allow", ""),
			with("refund", "k", "0"),
		} {
			code, _, stderr := pgrl(url, args...)
			require.Equal(t, 2, code, "%v", args)
			first, _, _ := strings.Cut(stderr, "\n")
			require.Equal(t, 1, strings.Count(first, "pgratelimit"), "%v: %s", args, first)
			require.NotContains(t, stderr, "pgratelimit: ", "%v", args)
		}
		// The library's own errors lose their "pgratelimit: " prefix too.
		bare := testdb.NewEmptySchema(t).URL(t)
		code, _, stderr := pgrl(bare, "peek", "k")
		require.Equal(t, 2, code)
		require.True(t, strings.HasPrefix(stderr, "pgratelimit peek: the pgratelimit tables are not in this database"), stderr)
		require.Contains(t, stderr, "'pgratelimit migrate up'")
		require.NotContains(t, stderr, "pgratelimit: ")
	})

	t.Run("a bad flag is reported once", func(t *testing.T) {
		code, stdout, stderr := pgrl(url, "allow", "k", "--bogus")
		require.Equal(t, 2, code)
		require.Empty(t, stdout)
		require.Equal(t, "pgratelimit allow: unknown flag --bogus\n"+
			"usage: pgratelimit allow KEY [--cost N]\n"+
			"Run 'pgratelimit allow --help' for its flags.\n", stderr)
	})

	t.Run("migrate down at version 0", func(t *testing.T) {
		bare := testdb.NewEmptySchema(t).URL(t)
		code, out, stderr := pgrl(bare, "migrate", "down")
		require.Equal(t, 0, code, stderr)
		require.True(t, strings.HasPrefix(out, "nothing to roll back: no migration is applied\n"), out)
		require.NotContains(t, out+stderr, "no next version")

		// Every migration, in order (00001_create_buckets.sql first).
		files, err := fs.Glob(migrations.FS, "*.sql")
		require.NoError(t, err)
		require.Equal(t, "00001_create_buckets.sql", files[0])
		var applied strings.Builder
		for _, f := range files {
			applied.WriteString("applied " + f + "\n")
		}
		code, out, _ = pgrl(bare, "migrate", "up")
		require.Equal(t, 0, code)
		require.True(t, strings.HasPrefix(out, applied.String()+"\n"), out)
		code, out, _ = pgrl(bare, "migrate", "up")
		require.Equal(t, 0, code)
		require.Contains(t, out, fmt.Sprintf("nothing to apply: all %d migrations are applied", len(files)))
		// Down, one step at a time, saying what each rollback throws away.
		var said []string
		for range files {
			code, out, _ = pgrl(bare, "migrate", "down", "--yes")
			require.Equal(t, 0, code)
			first, _, _ := strings.Cut(out, "\n")
			said = append(said, first)
		}
		require.Equal(t, []string{
			"rolled back 00010_overrides.sql: every key's override is dropped (its limiters' policy applies again at its next check) and the recorded policies are forgotten",
			"rolled back 00009_leases_in_rows.sql",
			"rolled back 00008_alerts.sql: the usage alerts' state and events are dropped: events not delivered yet are lost, and lines that fired this period fire again",
			"rolled back 00007_leases.sql: the leases tables are dropped: every lease is forgotten, so their units are free at once, and the fencing tokens start again from 1 after migrate up",
			"rolled back 00006_account.sql: the ledger's grant expiries and plan changes and the request IDs of refunds and grants are deleted, the grants' part of every ledger entry " +
				"and the first outcomes remembered for request IDs are dropped, and the buckets forget the capacity they were written with",
			"rolled back 00005_drop_expires_at_index.sql",
			"rolled back 00004_requests_and_ledger.sql: the ledger and the request IDs are dropped: every ledger entry is lost, and a charge retried with a request ID seen before would be charged again",
			"rolled back 00003_create_grants.sql: the grants table is dropped: every grant, and the credits left in them, are lost",
			"rolled back 00002_index_expires_at.sql",
			"rolled back 00001_create_buckets.sql: the bucket tables and every bucket in them are dropped",
		}, said)
	})

	t.Run("a negative refund is a number, not a flag", func(t *testing.T) {
		code, out, stderr := pgrl(url, with("refund", "k1", "-5")...)
		require.Equal(t, 2, code)
		require.Empty(t, out)
		require.NotContains(t, stderr, "flag provided but not defined")
		require.True(t, strings.HasPrefix(stderr, "pgratelimit refund: N: invalid cost: refund -5 is below 1\nusage: "), stderr)
		// A negative flag value is still a flag's value.
		code, _, stderr = pgrl(url, with("allow", "k1", "--cost", "-5")...)
		require.Equal(t, 2, code)
		require.Contains(t, stderr, "--cost: invalid cost: -5 is below 1")
	})
}

// silentServer accepts TCP connections and never answers: a hung host, or a
// wrong port behind a load balancer. It returns a database URL pointing at it.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // open, unanswered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return "postgres://nobody@" + ln.Addr().String() + "/app"
}

// A server that accepts connections and never answers makes every command
// fail within its connect timeout, saying so, instead of hanging.
func TestConnectTimeout(t *testing.T) {
	t.Parallel()
	url := silentServer(t)
	where := "could not connect to the database at " + strings.TrimPrefix(url, "postgres://nobody@")[:len(url)-len("postgres://nobody@")-len("/app")] + ` (user "nobody", database "app")`

	for _, args := range [][]string{
		{"peek", "k"},
		{"allow", "k", "--json"},
		{"migrate", "status"},
		{"cleanup"},
		{"bench", "--duration", "1s"},
		{"demo", "--once", "--addr", "127.0.0.1:0"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			code, _, stderr := pgrl(url, append(args, "--connect-timeout", "700ms")...)
			took := time.Since(start)
			require.Equal(t, 2, code, stderr)
			require.GreaterOrEqual(t, took, 700*time.Millisecond)
			// Which timeout gave up is in its message; the bound only catches
			// a hang, generously for a busy machine.
			require.Less(t, took, 30*time.Second, "gave up at its timeout, not hung")
			msg := where + ": no answer within 700ms (--connect-timeout)"
			if args[len(args)-1] == "--json" {
				var e errorJSON
				require.NoError(t, json.Unmarshal([]byte(stderr), &e), stderr)
				require.Equal(t, errorJSON{Error: msg, Code: "connect"}, e)
				return
			}
			require.Contains(t, stderr, "pgratelimit "+args[0]+": "+msg+"\n")
		})
	}

	t.Run("connect_timeout in the URL", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		code, _, stderr := pgrl(url+"?connect_timeout=1", "peek", "k")
		require.Equal(t, 2, code)
		require.Less(t, time.Since(start), 30*time.Second)
		require.Contains(t, stderr, where+": no answer within 1s (connect_timeout in the URL)")
	})

	t.Run("--timeout shorter than the connect timeout", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		code, _, stderr := pgrl(url, "reset", "k", "--timeout", "500ms")
		require.Equal(t, 2, code)
		require.Less(t, time.Since(start), 30*time.Second)
		require.Contains(t, stderr, "pgratelimit reset: gave up after 500ms (--timeout) connecting to the database at ")
	})

	t.Run("the defaults", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for the 5s default")
		}
		t.Parallel()
		_, help, _ := pgrl("", "peek", "--help")
		require.Regexp(t, `--connect-timeout D\s+give up connecting to the database after D.*\(default 5s\)`, help)
		require.Regexp(t, `--timeout D\s+give up on the command's database work after D; 0: never \(default 10s\)`, help)
		_, help, _ = pgrl("", "migrate", "--help")
		require.Regexp(t, `--timeout D .*\(default 5m0s\)`, help)

		start := time.Now()
		code, _, stderr := pgrl(url, "peek", "k")
		took := time.Since(start)
		require.Equal(t, 2, code)
		require.GreaterOrEqual(t, took, 5*time.Second)
		require.Contains(t, stderr, where+": no answer within 5s (--connect-timeout)")
	})
}

// --timeout bounds a command's database work: here a check waiting for a
// row that another transaction holds locked.
func TestCommandTimeout(t *testing.T) {
	t.Parallel()
	s := testdb.NewSchema(t)
	url := s.URL(t)
	code, _, stderr := pgrl(url, "allow", "locked", "--interval", "1h")
	require.Equal(t, 0, code, stderr)

	ctx := context.Background()
	pool := s.Pool(t, 1)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SELECT 1 FROM pgratelimit_buckets WHERE key = 'locked' FOR UPDATE")
	require.NoError(t, err)

	for _, args := range [][]string{
		{"allow", "locked", "--interval", "1h", "--timeout", "700ms"},
		{"refund", "locked", "1", "--interval", "1h", "--timeout", "700ms"},
	} {
		start := time.Now()
		code, _, stderr = pgrl(url, args...)
		took := time.Since(start)
		require.Equal(t, 2, code, stderr)
		require.GreaterOrEqual(t, took, 700*time.Millisecond)
		require.Less(t, took, 30*time.Second)
		require.Equal(t, "pgratelimit "+args[0]+": gave up after 700ms (--timeout): the database had not finished\n", stderr)
	}
	// Peeking takes no lock, so it is not held up.
	code, out, _ := pgrl(url, "peek", "locked", "--interval", "1h", "--timeout", "700ms")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"locked" has 9 of 10 tokens`)
}

// Ctrl-C (SIGINT) ends the demo cleanly: exit 0, so make reports no error.
func TestDemoInterrupt(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptySchema(t).URL(t)
	cmd, out := startCLI(t, url, "demo", "--addr", "127.0.0.1:0")
	var lines []string
	for out.Scan() {
		lines = append(lines, out.Text())
		if out.Text() == "Ctrl-C to stop." {
			break
		}
	}
	require.NotEmpty(t, lines, "the demo printed nothing before it exited (its error is on stderr)")
	require.Equal(t, "Ctrl-C to stop.", lines[len(lines)-1], "%q", lines)

	// The CLI line it prints runs, on the demo's credits (the database came
	// from DATABASE_URL: no export line).
	m := regexp.MustCompile(`(?m)^The CLI: +pgratelimit (.+?)  \(the credits above\)$`).FindStringSubmatch(strings.Join(lines, "\n"))
	require.NotNil(t, m, "%q", lines)
	code, stdout, stderr := pgrl(url, strings.Fields(m[1])...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"ip:127.0.0.1": 100 of 100 tokens in the bucket`)
	require.NotContains(t, strings.Join(lines, "\n"), "export DATABASE_URL")
	// And the one on their alerts, without --follow.
	m = regexp.MustCompile(`(?m)^ +pgratelimit (events .+?) --follow  \(their usage alerts\)$`).FindStringSubmatch(strings.Join(lines, "\n"))
	require.NotNil(t, m, "%q", lines)
	code, stdout, stderr = pgrl(url, strings.Fields(m[1])...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "no events for prefix \"demo-credits\", key \"ip:127.0.0.1\" (limiters with Config.Alerts write them)\n", stdout)
	// And the one on its jobs' leases: none yet.
	m = regexp.MustCompile(`(?m)^ +pgratelimit (leases .+?)  \(the jobs' leases\)$`).FindStringSubmatch(strings.Join(lines, "\n"))
	require.NotNil(t, m, "%q", lines)
	code, stdout, stderr = pgrl(url, strings.Fields(m[1])...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "no live leases of \"ip:127.0.0.1\" (prefix \"demo-jobs\")\n", stdout)

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	for out.Scan() {
		lines = append(lines, out.Text())
	}
	require.NoError(t, cmd.Wait(), "exit status 0")
	require.Equal(t, "Stopping.", lines[len(lines)-1])
}

// migrate distribute needs Citus, and says so on a plain PostgreSQL.
func TestMigrateDistributeWithoutCitus(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	code, _, stderr := pgrl(url, "migrate", "distribute")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "citus extension is not installed")
}

// grant adds credits, balance shows them, allow spends the bucket first and
// then the grants (the README's example: 2 in the bucket and 10 granted, a
// check of 4 leaves 0 and 8).
func TestGrantAndBalance(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "credits", "--capacity", "10", "--refill", "10", "--interval", "720h"}
	with := func(args ...string) []string { return append(args, policy...) }

	code, _, stderr := pgrl(url, with("allow", "acme", "--cost", "8")...)
	require.Equal(t, 0, code, stderr)
	code, out, stderr := pgrl(url, with("grant", "acme", "10")...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^granted 10 to "acme" \(grant \d+, never expires\): 10 granted in all, 2 of 10 in the bucket\n$`, out)

	code, out, _ = pgrl(url, with("allow", "acme", "--cost", "4")...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `allowed: took 4 tokens from "acme" (2 from the bucket, 2 from grants): 0 of 10 left and 8 granted`)

	code, out, _ = pgrl(url, with("allow", "acme", "--cost", "9")...)
	require.Equal(t, 1, code, "denied exits 1")
	require.Contains(t, out, `denied: "acme" has 0 of 10 tokens and 8 granted, not the 9 asked for (nothing taken)`)

	code, out, stderr = pgrl(url, with("grant", "acme", "5", "--expires", "2999-01-01")...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "expires 2999-01-01T00:00:00Z): 13 granted in all")
	code, out, stderr = pgrl(url, with("grant", "acme", "7", "--expires", "2000-01-01T00:00:00Z")...)
	require.Equal(t, 2, code, "a grant that has expired already is refused")
	require.Empty(t, out)
	require.Regexp(t, `^pgratelimit grant: the grant's expiry, 2000-01-01 \d\d:00:00 \S+, is not in the future \(by the database's clock\): a grant is spent only before its expiry, so nothing was granted \(give a later --expires\)\n$`, stderr)

	code, out, _ = pgrl(url, with("balance", "acme")...)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Contains(t, lines[0], `"acme": 0 of 10 tokens in the bucket`)
	require.Contains(t, lines[0], "13 granted in 2 live grants")
	require.Regexp(t, `^  grant \d+: 5 left, expires 2999-01-01T00:00:00Z`, lines[1], "soonest-expiring first")
	require.Regexp(t, `^  grant \d+: 8 left, never expires`, lines[2])

	code, out, _ = pgrl(url, with("balance", "acme", "--json")...)
	require.Equal(t, 0, code)
	var bal struct {
		Remaining int64 `json:"remaining"`
		Granted   int64 `json:"granted"`
		Grants    []struct {
			Amount    int64      `json:"amount"`
			ExpiresAt *time.Time `json:"expires_at"`
		} `json:"grants"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &bal))
	require.Equal(t, int64(13), bal.Granted)
	require.Len(t, bal.Grants, 2)
	require.NotNil(t, bal.Grants[0].ExpiresAt)
	require.Nil(t, bal.Grants[1].ExpiresAt)

	for _, bad := range [][]string{
		with("grant", "acme", "0"),
		with("grant", "acme", "lots"),
		with("grant", "acme", "5", "--expires", "soon"),
		append(with("grant", "acme", "5"), "--storage", "ephemeral"),
	} {
		code, _, stderr := pgrl(url, bad...)
		require.Equal(t, 2, code, "%v: %s", bad, stderr)
	}
}

// Concurrent CLI checks spend a key's bucket and grants exactly.
func TestAllowSpendsGrantsExactly(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "par", "--capacity", "5", "--refill", "5", "--interval", "720h"}
	code, _, stderr := pgrl(url, append([]string{"grant", "k", "15"}, policy...)...)
	require.Equal(t, 0, code, stderr)
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 32 {
		wg.Go(func() {
			code, out, stderr := pgrl(url, append([]string{"allow", "k"}, policy...)...)
			if code != 0 && code != 1 {
				t.Errorf("allow: exit %d: %s %s", code, out, stderr)
			}
			mu.Lock()
			defer mu.Unlock()
			if code == 0 {
				allowed++
			}
		})
	}
	wg.Wait()
	require.Equal(t, 20, allowed, "5 in the bucket and 15 granted")
	code, out, _ := pgrl(url, append([]string{"balance", "k", "--json"}, policy...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":0`)
	require.Contains(t, out, `"granted":0`)
}

// allow --request-id charges once (a repeat says it is a replay, prints the
// first outcome and exits as it did; another cost is refused), settle brings
// it to its actual cost (once: again at the same cost is a replay, at
// another refused), ledger lists it.
func TestRequestIDSettleLedger(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "llm", "--capacity", "100", "--refill", "100", "--interval", "720h"}
	with := func(args ...string) []string { return append(args, policy...) }

	code, first, stderr := pgrl(url, with("allow", "acme", "--cost", "40", "--request-id", "call-1")...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^allowed: took 40 tokens from "acme": 60 of 100 left, full in \S+`, first)
	code, again, _ := pgrl(url, with("allow", "acme", "--cost", "40", "--request-id", "call-1")...)
	require.Equal(t, 0, code, "a replay exits as the first outcome did")
	firstOutcome, _, _ := strings.Cut(first, ", full in ") // (the moment it gives is counted from the first check's time)
	require.Regexp(t, `^replayed: request "call-1" was already charged \(nothing taken now\); its outcome then: `+regexp.QuoteMeta(firstOutcome)+", full in ", again)
	code, out, _ := pgrl(url, with("allow", "acme", "--cost", "40", "--request-id", "call-1", "--json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":60,`)
	require.Contains(t, out, `"replayed":true`)
	code, out, _ = pgrl(url, with("peek", "acme")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"acme" has 60 of 100 tokens`, "replays charged nothing")

	// The same ID for another cost is refused, and changes nothing.
	code, out, stderr = pgrl(url, with("allow", "acme", "--cost", "41", "--request-id", "call-1")...)
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Equal(t, "pgratelimit allow: request ID \"call-1\" was used on \"acme\" for a charge of 40, not a charge of 41: nothing taken (a new charge needs a new ID)\n", stderr)
	code, out, _ = pgrl(url, with("allow", "acme", "--cost", "5", "--request-id", "call-2", "--json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":55,`)
	require.Contains(t, out, `"replayed":false`, "a new ID is no replay")

	code, out, stderr = pgrl(url, with("settle", "acme", "--request-id", "call-1", "--actual", "25")...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "settled request \"call-1\" of \"acme\" at 25: 70 of 100 tokens\n", out)
	code, again, _ = pgrl(url, with("settle", "acme", "--request-id", "call-1", "--actual", "25")...)
	require.Equal(t, 0, code)
	require.Equal(t, "replayed: request \"call-1\" of \"acme\" was already settled at 25 (nothing changed now); then it left 70 of 100 tokens\n", again)
	code, again, _ = pgrl(url, with("settle", "acme", "--request-id", "call-1", "--actual", "25", "--json")...)
	require.Equal(t, 0, code)
	require.Contains(t, again, `"replayed":true`)
	require.Contains(t, again, `"actual":25`)
	code, out, stderr = pgrl(url, with("settle", "acme", "--request-id", "call-1", "--actual", "99")...)
	require.Equal(t, 2, code, "settling again at another actual is refused")
	require.Empty(t, out)
	require.Equal(t, "pgratelimit settle: request \"call-1\" of \"acme\" was settled already, at 25, not 99: a settlement is final (nothing changed)\n", stderr)
	code, _, stderr = pgrl(url, with("settle", "acme", "--request-id", "nope", "--actual", "1")...)
	require.Equal(t, 2, code)
	require.Equal(t, "pgratelimit settle: no allowed charge with request ID \"nope\" is remembered for \"acme\" (never allowed, or past its retention): nothing to settle\n", stderr)
	code, _, _ = pgrl(url, with("settle", "acme", "--actual", "1")...)
	require.Equal(t, 2, code, "--request-id is required")
	code, out, _ = pgrl(url, with("peek", "acme", "--json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":70,`, "the refused settlement changed nothing")

	code, out, _ = pgrl(url, with("ledger", "acme")...)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `charge\s+-40\s+balance 60\s+request "call-1"`, lines[0])
	require.Regexp(t, `charge\s+-5\s+balance 55\s+request "call-2"`, lines[1])
	require.Regexp(t, `settle\s+\+15\s+balance 70\s+request "call-1"`, lines[2])
	code, out, _ = pgrl(url, with("ledger", "acme", "--json", "--since", "1h")...)
	require.Equal(t, 0, code)
	var entries []struct {
		Amount  int64  `json:"amount"`
		Kind    string `json:"kind"`
		Balance int64  `json:"balance"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &entries))
	require.Len(t, entries, 3)
	require.Equal(t, int64(70), entries[2].Balance)
}

// Calendar periods from the policy flags: --every, --tz, --anchor.
func TestCalendarFlags(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "monthly", "--capacity", "3", "--refill", "3", "--every", "month", "--tz", "Europe/Berlin", "--anchor", "2026-01-17"}
	for range 3 {
		code, out, stderr := pgrl(url, append([]string{"allow", "k"}, policy...)...)
		require.Equal(t, 0, code, out+stderr)
	}
	code, out, _ := pgrl(url, append([]string{"allow", "k", "--json"}, policy...)...)
	require.Equal(t, 1, code)
	var r struct {
		RetryAfterMS int64 `json:"retry_after_ms"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	now := time.Now().In(berlin)
	next := time.Date(now.Year(), now.Month(), 17, 0, 0, 0, 0, berlin)
	if !next.After(now) {
		next = time.Date(now.Year(), now.Month()+1, 17, 0, 0, 0, 0, berlin)
	}
	require.InDelta(t, time.Until(next).Milliseconds(), r.RetryAfterMS, 60_000, "the quota renews on the 17th at midnight in Berlin")

	for _, bad := range [][]string{
		{"allow", "k", "--every", "year"},
		{"allow", "k", "--every", "month", "--interval", "1h"},
		{"allow", "k", "--every", "day", "--tz", "Mars/Olympus"},
		{"allow", "k", "--every", "week", "--anchor", "someday"},
	} {
		code, _, stderr := pgrl(url, bad...)
		require.Equal(t, 2, code, "%v: %s", bad, stderr)
	}
}

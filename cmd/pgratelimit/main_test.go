package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// pgrl runs the CLI in-process with DATABASE_URL set to url.
func pgrl(url string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	code = run(context.Background(), args, &out, &errOut, getenv)
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
	require.Contains(t, out, `allowed: "user-1" has 1 of 3 tokens`)

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
		{[]string{"allow"}, "wrong number of arguments"},
		{[]string{"allow", "a", "b"}, "wrong number of arguments"},
		{[]string{"allow", "k", "--cost", "many"}, "invalid value"},
		{[]string{"allow", "k", "--cost", "0"}, "invalid cost"},
		{[]string{"allow", "k", "--cost", "11"}, "cost exceeds capacity"},
		{[]string{"allow", "k", "--capacity", "0"}, "Capacity"},
		{[]string{"allow", "k", "--storage", "floppy"}, "--storage"},
		{[]string{"allow", ""}, "invalid key"},
		{[]string{"refund", "k", "x"}, "must be a whole number"},
		{[]string{"migrate", "sideways"}, "unknown migrate action"},
		{[]string{"bench", "--mode", "turbo"}, "--mode must be"},
	} {
		// The URL points nowhere: none of these may reach a database.
		code, _, stderr := pgrl("postgres://nobody@127.0.0.1:1/x?connect_timeout=1", tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, _, stderr := pgrl("", "peek", "k")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "DATABASE_URL")
	for _, cmd := range commands {
		code, _, stderr := pgrl("", cmd.name, "--help")
		require.Equal(t, 0, code, cmd.name)
		require.Contains(t, stderr, "usage: pgratelimit "+cmd.name, cmd.name)
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
	require.Contains(t, out, "Stopped and removed")
	require.False(t, strings.Contains(stderr, "ERROR"), stderr)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// With --json, an error is a JSON object on stderr, with a code, and the
// exit status is the text output's.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	for _, tc := range []struct {
		url  string
		args []string
		code string
		msg  string
	}{
		{"", []string{"peek", "k", "--json"}, "usage", "no database: set --database-url or DATABASE_URL"},
		{url, []string{"allow", "k", "--json", "--cost", "0"}, "invalid_cost", "--cost: invalid cost: 0 is below 1"},
		{url, []string{"allow", "k", "--json", "--bogus"}, "usage", "unknown flag --bogus"},
		{url, []string{"allow", "k", "--bogus", "--json"}, "usage", "unknown flag --bogus"},
		{url, []string{"allow", "k", "--json", "--capacity", "0"}, "usage", "--capacity must be > 0, got 0"},
		{url, []string{"settle", "k", "--json", "--request-id", "nope", "--actual", "3"}, "unknown_request", `no allowed charge with request ID "nope"`},
		{testdb.NewEmptySchema(t).URL(t), []string{"peek", "k", "--json"}, "not_migrated", "the pgratelimit tables are not in this database"},
		{"postgres://nobody@127.0.0.1:1/x?connect_timeout=1", []string{"peek", "k", "--json"}, "connect", "could not connect to the database at 127.0.0.1:1"},
	} {
		code, stdout, stderr := pgrl(tc.url, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Empty(t, stdout, "%v", tc.args)
		var e errorJSON
		require.NoError(t, json.Unmarshal([]byte(stderr), &e), "%v: %s", tc.args, stderr)
		require.Equal(t, tc.code, e.Code, "%v", tc.args)
		require.Contains(t, e.Error, tc.msg, "%v", tc.args)
		require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %s", stderr)
	}
	// A denial is no error: exit 1 and the result on stdout.
	code, _, stderr := pgrl(url, "allow", "k", "--cost", "10", "--json", "--interval", "1h")
	require.Equal(t, 0, code, stderr)
	code, out, stderr := pgrl(url, "allow", "k", "--json", "--interval", "1h")
	require.Equal(t, 1, code)
	require.Empty(t, stderr)
	require.Contains(t, out, `"allowed":false`)
}

// --json says "never" as null; a denial's JSON has from_grants (0) too.
func TestJSONNever(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	code, out, stderr := pgrl(url, "allow", "k", "--cost", "11", "--json")
	require.Equal(t, 1, code, stderr)
	var r map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Contains(t, r, "retry_after_ms")
	require.Nil(t, r["retry_after_ms"], "refills alone never allow it: null")
	require.Equal(t, 0.0, r["from_grants"])
	require.Equal(t, false, r["replayed"])

	code, _, _ = pgrl(url, "allow", "k", "--cost", "10", "--json", "--interval", "1h")
	require.Equal(t, 0, code)
	code, out, _ = pgrl(url, "allow", "k", "--json", "--interval", "1h")
	require.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Greater(t, r["retry_after_ms"], 0.0, "a wait: a number")
	require.Equal(t, 0.0, r["from_grants"])

	code, _, _ = pgrl(url, "acquire", "j", "--max", "1", "--ttl", "1m", "--json")
	require.Equal(t, 0, code)
	code, out, _ = pgrl(url, "acquire", "j", "--max", "1", "--ttl", "1m", "--json", "--weight", "1")
	require.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Greater(t, r["retry_after_ms"], 0.0)
}

// grant --request-id grants once per ID: a webhook retried grants nothing
// more; the same ID for another amount is refused.
func TestGrantRequestID(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	expires := time.Now().Add(30 * 24 * time.Hour).UTC().Format(time.RFC3339)
	code, first, stderr := pgrl(url, "grant", "acme", "100", "--request-id", "pay-1", "--expires", expires)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^granted 100 to "acme" \(grant \d+, expires \S+\): 100 granted in all`, first)
	for range 2 {
		code, again, stderr := pgrl(url, "grant", "acme", "100", "--request-id", "pay-1", "--expires", expires)
		require.Equal(t, 0, code, stderr)
		require.Equal(t, first, again, "the same grant, nothing more")
	}
	code, out, _ := pgrl(url, "balance", "acme", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"granted":100,`)

	code, _, stderr = pgrl(url, "grant", "acme", "50", "--request-id", "pay-1", "--expires", expires)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `request ID "pay-1" was used on "acme" for a grant of 100, not this grant of 50: nothing granted`)
	code, out, _ = pgrl(url, "grant", "acme", "5", "--request-id", "pay-2", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"request_id":"pay-2"`)
	require.Contains(t, out, `"granted":105,`)
}

// migrate down asks on a terminal, and refuses without --yes when stdin
// is not one.
func TestMigrateDownConfirms(t *testing.T) {
	t.Parallel()
	url := testdb.NewEmptySchema(t).URL(t)
	code, _, stderr := pgrl(url, "migrate", "up")
	require.Equal(t, 0, code, stderr)
	applied := func() int {
		_, out, _ := pgrl(url, "migrate", "status", "--json")
		return strings.Count(out, `"applied":true`)
	}
	n := applied()

	code, out, stderr := pgrl(url, "migrate", "down")
	require.Equal(t, 2, code)
	require.Empty(t, out)
	require.Contains(t, stderr, "pgratelimit migrate: migrate down rolls back 00010_overrides.sql: every key's override is dropped (its limiters' policy applies again at its next check) and the recorded policies are forgotten; give --yes to roll back without a terminal to confirm on")
	require.Equal(t, n, applied(), "nothing rolled back")

	onTerminal := func(answer string) (int, string, string) {
		var o, e bytes.Buffer
		getenv := databaseURL(url)
		code := runCLI(context.Background(), &cli{stdin: strings.NewReader(answer), terminal: true, stdout: &o, stderr: &e, getenv: getenv}, []string{"migrate", "down"})
		return code, o.String(), e.String()
	}
	code, _, stderr = onTerminal("no\n")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "migrate down rolls back 00010_overrides.sql: every key's override is dropped (its limiters' policy applies again at its next check) and the recorded policies are forgotten.\nRoll back? Type yes to go on: ")
	require.Contains(t, stderr, "not confirmed: nothing rolled back")
	require.Equal(t, n, applied())
	code, out, stderr = onTerminal("yes\n")
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasPrefix(out, "rolled back 00010_overrides.sql: every key's override is dropped"), out)
	require.Equal(t, n-1, applied())

	code, out, stderr = pgrl(url, "migrate", "down", "--yes")
	require.Equal(t, 0, code, stderr)
	require.True(t, strings.HasPrefix(out, "rolled back 00009_leases_in_rows.sql"), out)
	require.Equal(t, n-2, applied())
}

// A URL of another database is told a postgres:// URL is expected.
func TestNotAPostgresURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"mysql://app:secret@localhost:3306/app", "redis://localhost:6379"} {
		code, _, stderr := pgrl(u, "peek", "k")
		require.Equal(t, 2, code)
		scheme, _, _ := strings.Cut(u, "://")
		require.Contains(t, stderr, "the database URL is a "+scheme+":// URL: pgratelimit needs PostgreSQL, a postgres:// (or postgresql://) URL")
		require.NotContains(t, stderr, "secret")
	}
}

// events --follow says on stderr that it waits while there are no events.
func TestEventsFollowSaysItWaits(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, stderr lockedBuffer
	getenv := databaseURL(url)
	done := make(chan int, 1)
	go func() {
		done <- runCLI(ctx, &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &stderr, getenv: getenv}, []string{"events", "--follow", "--key", "k"})
	}()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "\n") }, time.Minute, 10*time.Millisecond)
	require.Equal(t, "pgratelimit events: no events for key \"k\" yet; waiting for new ones (Ctrl-C to stop)\n", stderr.String())
	cancel()
	require.Equal(t, 0, <-done)
	require.Empty(t, out.String())
}

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A cost above --capacity goes to the library when the CLI's limiter has
// grants (durable storage): allowed when the bucket and the grants cover it,
// else an ordinary denial. Only ephemeral storage, which has no grants,
// refuses it as a usage error (TestUsageErrors).
func TestAllowAboveCapacityWithGrants(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "big", "--capacity", "20", "--refill", "20", "--interval", "720h"}
	with := func(args ...string) []string { return append(args, policy...) }

	code, _, stderr := pgrl(url, with("grant", "acme", "100")...)
	require.Equal(t, 0, code, stderr)
	code, out, stderr := pgrl(url, with("allow", "acme", "--cost", "50")...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^allowed: took 50 tokens from "acme" \(20 from the bucket, 30 from grants\): 0 of 20 left and 70 granted, full in \S+`, out)

	code, out, stderr = pgrl(url, with("allow", "acme", "--cost", "30", "--json")...)
	require.Equal(t, 0, code, stderr)
	var r struct {
		Allowed    bool   `json:"allowed"`
		Remaining  int64  `json:"remaining"`
		Granted    int64  `json:"granted"`
		FromGrants *int64 `json:"from_grants"`
		Replayed   *bool  `json:"replayed"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.True(t, r.Allowed)
	require.Equal(t, int64(40), r.Granted)
	require.NotNil(t, r.FromGrants)
	require.Equal(t, int64(30), *r.FromGrants, "the bucket was empty: all from grants")
	require.NotNil(t, r.Replayed)
	require.False(t, *r.Replayed)

	code, out, _ = pgrl(url, with("allow", "acme", "--cost", "5")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `^allowed: took 5 tokens from "acme" \(all from grants\): 0 of 20 left and 35 granted`, out)

	// More than the bucket and the grants can ever hold: a denial, not an error.
	code, out, stderr = pgrl(url, with("allow", "acme", "--cost", "56")...)
	require.Equal(t, 1, code, stderr)
	require.Equal(t, "denied: \"acme\" has 0 of 20 tokens and 35 granted, not the 56 asked for (nothing taken); refills alone will never cover it (grant more)\n", out)
	// Covered once the bucket refills: a wait.
	code, out, _ = pgrl(url, with("allow", "acme", "--cost", "50")...)
	require.Equal(t, 1, code)
	require.Regexp(t, `; retry in \d+d( \d+h)? \(\d{4}-\d\d-\d\d \d\d:\d\d \S+\)\n$`, out, "a wait over a day gives the moment too")

	// A key with no grants: above the capacity is denied for ever.
	code, out, _ = pgrl(url, with("allow", "poor", "--cost", "21")...)
	require.Equal(t, 1, code)
	require.Contains(t, out, "refills alone will never cover it (grant more)")
	// Within the bucket, from the bucket alone: nothing said about grants.
	code, out, _ = pgrl(url, with("allow", "poor", "--cost", "20")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `^allowed: took 20 tokens from "poor": 0 of 20 left, full in `, out)
}

// A settlement above the estimate leaves a debt: settle, peek and balance
// show it (Remaining below zero), a grant repays it at once.
func TestDebt(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	policy := []string{"--prefix", "owe", "--capacity", "10", "--refill", "10", "--interval", "720h"}
	with := func(args ...string) []string { return append(args, policy...) }

	code, _, stderr := pgrl(url, with("allow", "k", "--cost", "10", "--request-id", "job-1")...)
	require.Equal(t, 0, code, stderr)
	code, out, stderr := pgrl(url, with("settle", "k", "--request-id", "job-1", "--actual", "15")...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "settled request \"job-1\" of \"k\" at 15: -5 of 10 tokens (a debt of 5): checks are denied until refills or grants repay the debt\n", out)

	code, out, _ = pgrl(url, with("peek", "k")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `^"k" has -5 of 10 tokens \(a debt of 5\): a check of 1 is allowed again in \d+d( \d+h)? \(\S+ \S+ \S+\), full in \d+d( \d+h)? \(\S+ \S+ \S+\)\n$`, out)
	code, out, _ = pgrl(url, with("balance", "k")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `^"k": -5 of 10 tokens in the bucket \(a debt of 5, repaid by refills or grants; full in [^)]+\)\); 0 granted in 0 live grants\n$`, out)
	code, out, _ = pgrl(url, with("peek", "k", "--json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"remaining":-5,`)
	code, out, _ = pgrl(url, with("allow", "k")...)
	require.Equal(t, 1, code)
	require.Regexp(t, `^denied: "k" has -5 of 10 tokens \(a debt of 5\), not the 1 asked for \(nothing taken\); retry in `, out)

	code, out, stderr = pgrl(url, with("grant", "k", "8")...)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^granted 8 to "k" \(grant \d+, never expires, 5 of it repaid the key's debt\): 3 granted in all, 0 of 10 in the bucket\n$`, out)
	code, out, _ = pgrl(url, with("peek", "k")...)
	require.Equal(t, 0, code)
	require.Regexp(t, `^"k" has 0 of 10 tokens \(empty\) and 3 granted, full in `, out)
}

// The ledger shows every kind of row, with the part of each change in
// grants and the part of the balance in grants: a grant's expiry (written by
// the first operation after it) and a plan change among them.
func TestLedgerKinds(t *testing.T) {
	t.Parallel()
	url := testdb.NewSchema(t).URL(t)
	small := []string{"--prefix", "ledg", "--capacity", "10", "--refill", "10", "--interval", "720h"}
	big := []string{"--prefix", "ledg", "--capacity", "20", "--refill", "20", "--interval", "720h"}
	run := func(policy []string, args ...string) string {
		t.Helper()
		code, out, stderr := pgrl(url, append(args, policy...)...)
		require.Equal(t, 0, code, "%v: %s%s", args, out, stderr)
		return out
	}
	run(small, "grant", "k", "5", "--expires", "2s")
	run(small, "grant", "k", "30")
	run(small, "allow", "k", "--cost", "12")
	time.Sleep(2100 * time.Millisecond)   // the first grant expires
	run(big, "allow", "k", "--cost", "1") // a plan change too: 10 more now

	out := run(small, "ledger", "k")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	at := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\s+`
	require.Regexp(t, "^"+at+`grant\s+\+5 \(grants \+5\)  balance 15 \(granted 5\)$`, lines[0])
	require.Regexp(t, "^"+at+`grant\s+\+30 \(grants \+30\)  balance 45 \(granted 35\)$`, lines[1])
	// The bucket first, then the soonest-expiring grant.
	require.Regexp(t, "^"+at+`charge\s+-12 \(grants -2\)  balance 33 \(granted 33\)$`, lines[2])
	// The bucket's 10 more of the bigger plan, what was left of the expired
	// grant (3), then the charge, all at the time of the check.
	require.Regexp(t, "^"+at+`plan\s+\+10  balance 43 \(granted 33\)$`, lines[3])
	require.Regexp(t, "^"+at+`expire\s+-3 \(grants -3\)  balance 40 \(granted 30\)$`, lines[4])
	require.Regexp(t, "^"+at+`charge\s+-1  balance 39 \(granted 30\)$`, lines[5])

	var entries []struct {
		Kind         string `json:"kind"`
		Amount       int64  `json:"amount"`
		GrantsAmount *int64 `json:"grants_amount"`
		Balance      int64  `json:"balance"`
		Granted      *int64 `json:"granted"`
	}
	require.NoError(t, json.Unmarshal([]byte(run(small, "ledger", "k", "--json")), &entries))
	require.Len(t, entries, 6)
	require.Equal(t, "charge", entries[2].Kind)
	require.Equal(t, int64(-2), *entries[2].GrantsAmount)
	require.Equal(t, int64(33), *entries[2].Granted)
	require.Equal(t, int64(0), *entries[5].GrantsAmount)
}

func TestLedgerLine(t *testing.T) {
	at := time.Date(2026, 11, 25, 9, 58, 3, 123456000, time.UTC)
	require.Equal(t, `2026-11-25T09:58:03.123456Z  charge  -50 (grants -30)  balance 70 (granted 70)  request "call-1"`,
		ledgerLine(pgratelimit.LedgerEntry{At: at, Kind: "charge", Amount: -50, GrantsAmount: -30, Balance: 70, Granted: 70, RequestID: "call-1"}))
	require.Equal(t, `2026-11-25T09:58:03Z         plan    +10  balance 15`,
		ledgerLine(pgratelimit.LedgerEntry{At: at.Truncate(time.Second), Kind: "plan", Amount: 10, Balance: 15}))
}

// peekText: the tokens (a debt below zero), the grants, when a check of 1
// may pass if not now, and when the bucket is full.
func TestPeekText(t *testing.T) {
	now := time.Date(2026, 11, 25, 9, 55, 30, 0, time.UTC)
	for _, tc := range []struct {
		r    pgratelimit.Result
		want string
	}{
		{pgratelimit.Result{Allowed: true, Limit: 3, Remaining: 3}, `"k" has 3 of 3 tokens (full)`},
		{pgratelimit.Result{Allowed: true, Limit: 3, Remaining: 3, Granted: 8}, `"k" has 3 of 3 tokens (full) and 8 granted`},
		{pgratelimit.Result{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: 2 * time.Hour}, `"k" has 1 of 3 tokens, full in 2h`},
		{pgratelimit.Result{Allowed: true, Limit: 3, Remaining: 0, Granted: 5, ResetAfter: 90 * time.Second}, `"k" has 0 of 3 tokens (empty) and 5 granted, full in 1m 30s`},
		{pgratelimit.Result{Limit: 3, RetryAfter: 20 * time.Second, ResetAfter: time.Minute}, `"k" has 0 of 3 tokens (empty): next token in 20s, full in 1m`},
		{pgratelimit.Result{Limit: 3, RetryAfter: 36 * time.Hour, ResetAfter: 36 * time.Hour}, `"k" has 0 of 3 tokens (empty): full again in 1d 12h (2026-11-26 21:56 UTC)`},
		{pgratelimit.Result{Limit: 10, Remaining: -5, RetryAfter: 6 * time.Second, ResetAfter: 15 * time.Second}, `"k" has -5 of 10 tokens (a debt of 5): a check of 1 is allowed again in 6s, full in 15s`},
		{pgratelimit.Result{Limit: 10, Remaining: -5, RetryAfter: pgratelimit.InfDuration, ResetAfter: 15 * time.Second}, `"k" has -5 of 10 tokens (a debt of 5): refills alone will never cover a check of 1, full in 15s`},
	} {
		require.Equal(t, tc.want, peekText("k", tc.r, now))
	}
}

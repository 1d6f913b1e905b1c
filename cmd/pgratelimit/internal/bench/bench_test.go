package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// defaults are the options of the bench command with no flags.
func defaults(t *testing.T) Options {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("bench", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse(nil))
	return o
}

func TestConfig(t *testing.T) {
	o := defaults(t)
	cfg, err := o.Config()
	require.NoError(t, err)
	require.Equal(t, "bench", cfg.Prefix)
	require.Equal(t, int64(1<<40), cfg.Capacity)
	require.Equal(t, "ours-coalesce-durable", o.contender())
	require.Equal(t, 64, o.conns())
	require.Equal(t, "sync", o.Commit)
	require.False(t, cfg.AsyncCommit)

	o.Commit = "async"
	cfg, err = o.Config()
	require.NoError(t, err)
	require.True(t, cfg.AsyncCommit)
	require.Equal(t, "ours-coalesce-durable-async", o.contender())
	o.Storage = "ephemeral"
	cfg, err = o.Config()
	require.NoError(t, err, "asynchronous commit on unlogged tables too (the peer benchmark's unlogged scenario)")
	require.True(t, cfg.AsyncCommit)

	o = defaults(t)
	o.Leases, o.Mode, o.Storage, o.RequestIDs = true, "per-check", "ephemeral", true
	_, err = o.Config()
	require.NoError(t, err)
	require.Equal(t, pgratelimit.SemaphoreConfig{Prefix: "bench", Max: 8, TTL: LeaseTTL, Storage: pgratelimit.Ephemeral, DisableCoalescing: true}, o.SemaphoreConfig())
	require.Equal(t, "ours-per-check-ephemeral-leases-requestids", o.contender())

	o = defaults(t)
	o.Alerts = true
	cfg, err = o.Config()
	require.NoError(t, err)
	require.Equal(t, BenchAlerts, cfg.Alerts)
	require.Equal(t, "ours-coalesce-durable-alerts", o.contender())

	for _, tc := range []struct {
		change func(*Options)
		want   string
	}{
		{func(o *Options) { o.Keys = 0 }, "--concurrency, --keys and --duration must be positive"},
		{func(o *Options) { o.Limits = 3 }, "--limits must be 1 or 2, got 3"},
		{func(o *Options) { o.Mode = "turbo" }, `--mode must be coalesce or per-check, got "turbo"`},
		{func(o *Options) { o.Storage = "floppy" }, `--storage must be durable or ephemeral, got "floppy"`},
		{func(o *Options) { o.Grants = -1 }, "--grants must be at least 0"},
		{func(o *Options) { o.Prefill = 5 }, "--prefill must be 0 or at least --keys (10000), got 5"},
		{func(o *Options) { o.Commit = "lazy" }, `--commit must be sync or async, got "lazy"`},
		{func(o *Options) { o.Commit, o.RequestIDs = "async", true }, "--commit async does not go with --request-ids: an exactly-once charge must survive a crash, so it commits synchronously (drop --request-ids, or use --commit sync)"},
		{func(o *Options) { o.Leases, o.Grants, o.Ledger, o.Alerts = true, 5, true, true }, "--leases does not go with --grants, --ledger, --alerts: they set up checks of buckets, and a run with --leases makes none (its limit is --lease-max)"},
		{func(o *Options) { o.Leases, o.Capacity, o.Limits = true, 5, 2 }, "--leases does not go with --capacity, --refill, --interval, --limits: they set up checks of buckets"},
		{func(o *Options) { o.Leases, o.Commit, o.Prefill, o.DenyCache = true, "async", 10000, 5 }, "--leases does not go with --deny-cache, --commit async, --prefill:"},
		{func(o *Options) { o.Leases, o.LeaseMax = true, 0 }, "--lease-max must be at least 1, got 0"},
		{func(o *Options) { o.Leases, o.Cost = true, 9 }, "--cost 9, the weight of each lease, is more than --lease-max 8: no lease could be acquired"},
	} {
		bad := defaults(t)
		tc.change(&bad)
		_, err := bad.Config()
		var ue clierr.UsageError
		require.True(t, errors.As(err, &ue), "%v", err)
		require.True(t, strings.HasPrefix(ue.Msg, tc.want), "%s\nwant %s", ue.Msg, tc.want)
	}
}

// A short run with a small bucket, two limits, grants, request IDs and a
// prefill: the audit holds, every figure is there, and the scratch schema
// is gone afterwards.
func TestRun(t *testing.T) {
	t.Parallel()
	s := testdb.NewEmptySchema(t)
	o := defaults(t)
	o.Concurrency, o.Keys, o.Duration, o.Capacity, o.Refill, o.Interval = 4, 10, 500*time.Millisecond, 3, 1, time.Hour
	o.Limits, o.Grants, o.RequestIDs, o.Prefill = 2, 2, true, 20
	pcfg, err := pgxpool.ParseConfig(s.URL(t))
	require.NoError(t, err)
	var progress bytes.Buffer
	rep, err := Run(context.Background(), o, Env{Pool: pcfg, Progress: &progress})
	require.NoError(t, err)
	require.True(t, rep.OK(), rep.Audit)
	require.Equal(t, "ours-coalesce-durable-2limits-grants-requestids", rep.Contender)
	require.Positive(t, rep.Allowed)
	require.Positive(t, rep.Denied, "10 keys of 3 tokens and 2 credits each run out")
	require.LessOrEqual(t, rep.Allowed, int64(10*(3+1+2)))
	require.Positive(t, rep.ChecksPerSec)
	require.Positive(t, rep.ClientUsPerCheck)
	require.Equal(t, int64(20), rep.PrefillRows)
	require.Positive(t, rep.TableBytes)
	require.Equal(t, 2, rep.Limits)
	require.Equal(t, "sync", rep.Commit)

	var text bytes.Buffer
	rep.WriteText(&text, o.Duration, o.Cost)
	require.True(t, strings.HasPrefix(text.String(), "ours-coalesce-durable-2limits-grants-requestids: 4 in flight, 10 keys, 500ms, cost 1\n"), text.String())
	require.Contains(t, text.String(), "  audit: ok\n")

	var left int
	pool := s.Pool(t, 1)
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgratelimit_bench_%'`).Scan(&left))
	require.Zero(t, left, "the scratch schema is dropped")
}

// --commit async: a short run of two limits with asynchronous commit, whose
// report says so. (Not in parallel with TestRun, which counts the scratch
// schemas left.)
func TestRunAsync(t *testing.T) {
	s := testdb.NewEmptySchema(t)
	o := defaults(t)
	o.Concurrency, o.Keys, o.Duration, o.Capacity, o.Refill, o.Interval = 4, 10, 300*time.Millisecond, 3, 1, time.Hour
	o.Limits, o.Commit = 2, "async"
	pcfg, err := pgxpool.ParseConfig(s.URL(t))
	require.NoError(t, err)
	rep, err := Run(context.Background(), o, Env{Pool: pcfg, Progress: io.Discard})
	require.NoError(t, err)
	require.True(t, rep.OK(), rep.Audit)
	require.Zero(t, rep.Errors)
	require.Positive(t, rep.Allowed)
	require.Equal(t, "ours-coalesce-durable-2limits-async", rep.Contender)
	require.Equal(t, "async", rep.Commit)
	line, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(line), `"commit":"async"`)
}

// --alerts: a short run whose small buckets cross the lines, with two
// limits (both with alerts) checked one by one; the report says so and
// counts the events.
// (Not in parallel with TestRun, which counts the scratch schemas left.)
func TestRunAlerts(t *testing.T) {
	s := testdb.NewEmptySchema(t)
	o := defaults(t)
	o.Concurrency, o.Keys, o.Duration, o.Capacity, o.Refill, o.Interval = 4, 10, 300*time.Millisecond, 3, 1, time.Hour
	o.Limits, o.Alerts, o.Mode = 2, true, "per-check"
	pcfg, err := pgxpool.ParseConfig(s.URL(t))
	require.NoError(t, err)
	rep, err := Run(context.Background(), o, Env{Pool: pcfg, Progress: io.Discard})
	require.NoError(t, err)
	require.True(t, rep.OK(), rep.Audit)
	require.Zero(t, rep.Errors)
	require.Positive(t, rep.Denied)
	require.Equal(t, "ours-per-check-durable-2limits-alerts", rep.Contender)
	require.True(t, rep.Alerts)
	// At most 4 events per key and limit: a bucket of 3 spent crosses
	// 0.8, 0.9 and 1 used, and a denial is exhausted (a balance of 3 is
	// never above 100 to fall past it).
	require.Positive(t, rep.Events)
	require.LessOrEqual(t, rep.Events, int64(10*4*2))
	line, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(line), `"alerts":true`)
	var text bytes.Buffer
	rep.WriteText(&text, o.Duration, o.Cost)
	require.Contains(t, text.String(), fmt.Sprintf("  alerts: %d events written\n", rep.Events))
}

// --leases: a short run of acquire+release pairs on a few keys of 2 units,
// most of them denied, in both coalescing modes: the audit holds, the
// report counts pairs and the CPU per pair, and says so in text and JSON.
// (Not in parallel with TestRun, which counts the scratch schemas left.)
func TestRunLeases(t *testing.T) {
	s := testdb.NewEmptySchema(t)
	for _, mode := range []string{"coalesce", "per-check"} {
		o := defaults(t)
		o.Concurrency, o.Keys, o.Duration, o.Leases, o.LeaseMax, o.Mode = 16, 2, 300*time.Millisecond, true, 2, mode
		pcfg, err := pgxpool.ParseConfig(s.URL(t))
		require.NoError(t, err)
		rep, err := Run(context.Background(), o, Env{Pool: pcfg, Progress: io.Discard})
		require.NoError(t, err)
		require.True(t, rep.OK(), rep.Audit)
		require.Zero(t, rep.Errors)
		require.Equal(t, "ours-"+mode+"-durable-leases", rep.Contender)
		require.True(t, rep.Leases)
		require.Equal(t, int64(2), rep.LeaseMax)
		require.Positive(t, rep.Pairs)
		require.Equal(t, rep.Allowed, rep.Pairs)
		require.Positive(t, rep.PairsPerSec)
		require.Positive(t, rep.ClientUsPerPair)
		// Acquisitions count the denied ones, which 16 workers on 2 keys of
		// 2 units meet or not depending on the machine's speed (TestLeaseAudit
		// checks the denials' audit).
		require.GreaterOrEqual(t, rep.ChecksPerSec, rep.PairsPerSec, "acquisitions, denied ones included")
		line, err := json.Marshal(rep)
		require.NoError(t, err)
		require.Contains(t, string(line), `"leases":true,"lease_max":2,"pairs":`)
		var text bytes.Buffer
		rep.WriteText(&text, o.Duration, o.Cost)
		require.True(t, strings.HasPrefix(text.String(), "ours-"+mode+"-durable-leases: 16 in flight, 2 keys, 300ms, leases of 1 unit of 2 per key, each released at once\n"), text.String())
		require.Regexp(t, `(?m)^  \d+ pairs/s \(acquire \+ release\)   p50 `, text.String())
		require.Contains(t, text.String(), fmt.Sprintf("\n  acquisitions: %.0f/s, %d acquired and released, %d denied (no free units), 0 errors\n", rep.ChecksPerSec, rep.Allowed, rep.Denied))
		require.Regexp(t, `(?m)^  CPU per pair: client \d+\.\d µs, server `, text.String())
		require.Contains(t, text.String(), "  audit: ok\n")
	}
}

// The lease audit fails on an answer that disagrees with Max, and on more
// units held by the workers at once than Max.
func TestLeaseAudit(t *testing.T) {
	a := &leaseAudit{max: 2, held: make([]atomic.Int64, 1)}
	a.answer(0, 1, pgratelimit.LeaseResult{Result: pgratelimit.Result{Allowed: true, Limit: 2, Remaining: 0}})
	a.answer(0, 1, pgratelimit.LeaseResult{Result: pgratelimit.Result{Limit: 2, Remaining: 0}})
	a.hold(0, 1)
	a.hold(0, 1)
	a.release(0, 1)
	a.hold(0, 1)
	require.Equal(t, "ok", a.verdict())
	a.hold(0, 1)
	require.Equal(t, "FAILED: key-0 had 3 units held at once by the run's workers, more than --lease-max 2", a.verdict())
	a = &leaseAudit{max: 2, held: make([]atomic.Int64, 1)}
	a.answer(0, 1, pgratelimit.LeaseResult{Result: pgratelimit.Result{Limit: 2, Remaining: 1}})
	require.Equal(t, "FAILED: an acquisition of 1 unit of key-0 was denied with 1 of 2 held", a.verdict())
	a = &leaseAudit{max: 2, held: make([]atomic.Int64, 1)}
	a.answer(0, 1, pgratelimit.LeaseResult{Result: pgratelimit.Result{Allowed: true, Limit: 2, Remaining: -1}})
	require.Equal(t, "FAILED: an acquisition of key-0 left 3 units held, more than --lease-max 2", a.verdict())
}

// Package bench is pgratelimit's load benchmark, the `pgratelimit bench`
// command: Options.Concurrency workers check keys drawn uniformly from
// Options.Keys for Options.Duration, in a scratch schema that Run creates and
// drops, then it reports throughput, latency, the CPU time a check cost in
// the client and the server, an exactness audit and the HOT-update ratio.
// With Options.Leases the workers acquire and release concurrency leases
// instead (a Semaphore), and the report counts acquire+release pairs.
//
// The peer benchmark of a checkout (bench/peers, in the bench module)
// compares it with the rate limiters and the plain SQL a team would
// otherwise use, running this benchmark (`pgratelimit bench --json`) as one
// contender among them.
package bench

import (
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/clierr"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Options is a load run's settings: the bench command's flags. AddFlags
// defines them with their defaults.
type Options struct {
	Concurrency   int           // --concurrency: checks in flight
	Keys          int           // --keys: distinct keys (1: one hot key)
	Duration      time.Duration // --duration: how long to run
	Cost          int64         // --cost: tokens per check
	Storage       string        // --storage: durable or ephemeral
	Mode          string        // --mode: coalesce or per-check
	Capacity      int64         // --capacity: bucket capacity
	Refill        int64         // --refill: tokens per interval
	Interval      time.Duration // --interval: refill interval
	Conns         int           // --conns: pool connections (0: Concurrency, at most 200)
	CoalesceConns int           // --coalesce-conns: ClientConfig.CoalesceConns
	Limits        int           // --limits: 1, or 2 (a second, daily limit in one AllowAll)
	Citus         bool          // --citus: distribute the scratch tables
	Grants        int64         // --grants: credits granted to every key first
	DenyCache     int           // --deny-cache: Config.DenyCacheSize
	Ledger        bool          // --ledger: Config.Ledger
	RequestIDs    bool          // --request-ids: a request ID per check
	NoRouting     bool          // --no-routing: ClientConfig.DisableRouting
	Prefill       int           // --prefill: live rows put in the table first
	Commit        string        // --commit: sync, or async (Config.AsyncCommit)
	Alerts        bool          // --alerts: Config.Alerts (BenchAlerts)
	Overrides     float64       // --overrides: Config.Overrides, on this fraction of the keys
	Leases        bool          // --leases: acquire and release leases (a Semaphore) instead of checks
	LeaseMax      int64         // --lease-max: SemaphoreConfig.Max with --leases
}

// The defaults of the bucket's flags, which --leases refuses to change: its
// limit is --lease-max.
const (
	defaultCapacity = 1 << 40
	defaultRefill   = 1
	defaultInterval = time.Second
)

// LeaseTTL is the TTL of the leases of a run with --leases: longer than any
// pair takes, so that every lease is released rather than expired.
const LeaseTTL = 30 * time.Second

// BenchAlerts are the usage alerts of a run with --alerts: lines at 80%,
// 90% and 100% of the capacity used, at a balance of 100, and the denial of
// a spent key. With the default capacity no check crosses one: the run
// prices alerts where nothing fires, as most checks of a service would.
var BenchAlerts = pgratelimit.Alerts{UsedFractions: []float64{0.8, 0.9, 1}, BalanceAtOrBelow: []int64{100}, Exhausted: true}

// AddFlags defines the options' flags, with their defaults, on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Concurrency, "concurrency", 64, "checks in flight")
	fs.IntVar(&o.Keys, "keys", 10000, "distinct keys, drawn uniformly (1: one hot key)")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to run")
	fs.Int64Var(&o.Cost, "cost", 1, "tokens per check")
	fs.StringVar(&o.Storage, "storage", "durable", "durable or ephemeral")
	fs.StringVar(&o.Mode, "mode", "coalesce", "coalesce (the default) or per-check")
	fs.Int64Var(&o.Capacity, "capacity", defaultCapacity, "bucket capacity (the default never denies; set a small one to exercise the audit)")
	fs.Int64Var(&o.Refill, "refill", defaultRefill, "tokens per interval")
	fs.DurationVar(&o.Interval, "interval", defaultInterval, "refill interval")
	fs.IntVar(&o.Conns, "conns", 0, "pool connections (default: --concurrency, at most 200)")
	fs.IntVar(&o.CoalesceConns, "coalesce-conns", 0, "ClientConfig.CoalesceConns (default: the library's)")
	fs.IntVar(&o.Limits, "limits", 1, "limits charged per check: 1, or 2 (the policy above, and one per day of the same capacity, in one AllowAll)")
	fs.BoolVar(&o.Citus, "citus", false, "distribute the scratch tables by key (Citus; also done when the citus extension is installed)")
	fs.Int64Var(&o.Grants, "grants", 0, "grant every key N credits before the run (Config.Grants), for checks that spill from the bucket into grants")
	fs.IntVar(&o.DenyCache, "deny-cache", 0, "Config.DenyCacheSize: deny keys denied before locally until their retry time (0: off)")
	fs.BoolVar(&o.Ledger, "ledger", false, "Config.Ledger: a ledger row per allowed check")
	fs.BoolVar(&o.RequestIDs, "request-ids", false, "give every check a request ID of its own (WithRequestID)")
	fs.BoolVar(&o.NoRouting, "no-routing", false, "on Citus, send every check through the coordinator (ClientConfig.DisableRouting)")
	fs.StringVar(&o.Commit, "commit", "sync", "sync, or async: Config.AsyncCommit, commits that do not wait for the WAL flush (not with --grants, --ledger or --request-ids)")
	fs.BoolVar(&o.Alerts, "alerts", false, "Config.Alerts: usage alerts at 80%, 90% and 100% used, at a balance of 100, and when exhausted (durable storage; the report counts the events written)")
	fs.Float64Var(&o.Overrides, "overrides", 0, "Config.Overrides, with an override (of the same capacity and refill) on this fraction of the --keys, spread evenly, e.g. 0.01 (0: off)")
	fs.IntVar(&o.Prefill, "prefill", 0, "fill the table with N live rows of the run's prefix before the run (full buckets, as checks left them: the run's --keys are the first of them); at least --keys")
	fs.BoolVar(&o.Leases, "leases", false, "concurrency leases instead of checks: each worker acquires a lease of --cost units of a key (a Semaphore of --lease-max units per key) and releases it at once; the report counts acquire+release pairs")
	fs.Int64Var(&o.LeaseMax, "lease-max", 8, "with --leases: the units each key has (SemaphoreConfig.Max)")
}

// Config checks the options and returns the limiter Config of the run; its
// errors are clierr.UsageErrors that name the flags. The Config itself is
// the library's to check (pgratelimit.New): its policy, and what it refuses
// together (--alerts on ephemeral storage, --commit async with --grants or
// --ledger). A request ID on an AsyncCommit limiter is refused at each call
// (ErrInvalidArgument), so Config refuses --commit async with --request-ids.
func (o Options) Config() (pgratelimit.Config, error) {
	var cfg pgratelimit.Config
	switch {
	case o.Concurrency < 1 || o.Keys < 1 || o.Duration <= 0:
		return cfg, clierr.Usagef("--concurrency, --keys and --duration must be positive")
	case o.Limits != 1 && o.Limits != 2:
		return cfg, clierr.Usagef("--limits must be 1 or 2, got %d", o.Limits)
	case o.Mode != "coalesce" && o.Mode != "per-check":
		return cfg, clierr.Usagef("--mode must be coalesce or per-check, got %q", o.Mode)
	case o.Commit != "sync" && o.Commit != "async":
		return cfg, clierr.Usagef("--commit must be sync or async, got %q", o.Commit)
	}
	switch o.Storage {
	case "durable":
		cfg.Storage = pgratelimit.Durable
	case "ephemeral":
		cfg.Storage = pgratelimit.Ephemeral
	default:
		return cfg, clierr.Usagef("--storage must be durable or ephemeral, got %q", o.Storage)
	}
	switch {
	case o.Grants < 0:
		return cfg, clierr.Usagef("--grants must be at least 0")
	case o.Prefill != 0 && o.Prefill < o.Keys:
		return cfg, clierr.Usagef("--prefill must be 0 or at least --keys (%d), got %d", o.Keys, o.Prefill)
	case o.Overrides < 0 || o.Overrides > 1:
		return cfg, clierr.Usagef("--overrides is a fraction of the keys, from 0 to 1, got %g", o.Overrides)
	case o.Commit == "async" && o.RequestIDs:
		return cfg, clierr.Usagef("--commit async does not go with --request-ids: an exactly-once charge must survive a crash, so it commits synchronously (drop --request-ids, or use --commit sync)")
	}
	if o.Leases {
		if err := o.checkLeases(); err != nil {
			return cfg, err
		}
	}
	cfg.Prefix, cfg.Capacity, cfg.Refill, cfg.Interval = "bench", o.Capacity, o.Refill, o.Interval
	cfg.DisableCoalescing = o.Mode == "per-check"
	cfg.Grants = o.Grants > 0
	cfg.DenyCacheSize = o.DenyCache
	cfg.Ledger = o.Ledger
	cfg.Overrides = o.Overrides > 0
	cfg.AsyncCommit = o.Commit == "async"
	if o.Alerts {
		cfg.Alerts = BenchAlerts
	}
	return cfg, nil
}

// checkLeases refuses, with --leases, the flags of checks, and a lease
// that could never be acquired.
func (o Options) checkLeases() error {
	checks := setFlags([]bool{o.Capacity != defaultCapacity || o.Refill != defaultRefill || o.Interval != defaultInterval,
		o.Limits != 1, o.Grants > 0, o.DenyCache > 0, o.Ledger, o.Alerts, o.Commit != "sync", o.Prefill > 0, o.Overrides > 0},
		"--capacity, --refill, --interval", "--limits", "--grants", "--deny-cache", "--ledger", "--alerts", "--commit async", "--prefill", "--overrides")
	switch {
	case len(checks) > 0:
		return clierr.Usagef("--leases does not go with %s: they set up checks of buckets, and a run with --leases makes none (its limit is --lease-max)", strings.Join(checks, ", "))
	case o.LeaseMax < 1:
		return clierr.Usagef("--lease-max must be at least 1, got %d", o.LeaseMax)
	case o.Cost > o.LeaseMax:
		return clierr.Usagef("--cost %d, the weight of each lease, is more than --lease-max %d: no lease could be acquired", o.Cost, o.LeaseMax)
	}
	return nil
}

// setFlags returns the flags (or names) whose set is true, in their order.
func setFlags(set []bool, flags ...string) []string {
	var out []string
	for i, f := range flags {
		if set[i] {
			out = append(out, f)
		}
	}
	return out
}

// SemaphoreConfig is the Semaphore of a run with --leases: --lease-max
// units per key, held LeaseTTL, in --storage, coalesced unless --mode
// per-check.
func (o Options) SemaphoreConfig() pgratelimit.SemaphoreConfig {
	cfg := pgratelimit.SemaphoreConfig{Prefix: "bench", Max: o.LeaseMax, TTL: LeaseTTL, DisableCoalescing: o.Mode == "per-check"}
	if o.Storage == "ephemeral" {
		cfg.Storage = pgratelimit.Ephemeral
	}
	return cfg
}

// conns is the pool's size: --conns, else --concurrency up to 200.
func (o Options) conns() int {
	if o.Conns == 0 {
		return min(o.Concurrency, 200)
	}
	return o.Conns
}

// contender names the run in its report: ours-MODE-STORAGE and what else
// it does (-alerts: --alerts; -async: --commit async; -leases: --leases).
func (o Options) contender() string {
	return "ours-" + o.Mode + "-" + o.Storage + strings.Join(setFlags(
		[]bool{o.Leases, o.Limits == 2, o.Grants > 0, o.DenyCache > 0, o.Ledger, o.RequestIDs, o.Alerts, o.Overrides > 0, o.Commit == "async"},
		"-leases", "-2limits", "-grants", "-denycache", "-ledger", "-requestids", "-alerts", "-overrides", "-async"), "")
}

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/migrations"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// runBench is a load generator: --concurrency workers check keys drawn
// uniformly from --keys for --duration, in a scratch schema it creates and
// drops, then it reports throughput, latency, an exactness audit and the
// HOT-update ratio.
func runBench(ctx context.Context, c *cli, args []string) int {
	f := newFlags(c, "bench")
	conc := f.Int("concurrency", 64, "checks in flight")
	keys := f.Int("keys", 10000, "distinct keys, drawn uniformly (1: one hot key)")
	duration := f.Duration("duration", 10*time.Second, "how long to run")
	cost := f.Int64("cost", 1, "tokens per check")
	storage := f.String("storage", "durable", "durable or ephemeral")
	mode := f.String("mode", "coalesce", "coalesce (the default) or per-check")
	capacity := f.Int64("capacity", 1<<40, "bucket capacity (the default never denies; set a small one to exercise the audit)")
	refill := f.Int64("refill", 1, "tokens per interval")
	interval := f.Duration("interval", time.Second, "refill interval")
	conns := f.Int("conns", 0, "pool connections (default: --concurrency, at most 200)")
	coalesceConns := f.Int("coalesce-conns", 0, "Config.CoalesceConns (default: the library's)")
	limits := f.Int("limits", 1, "limits charged per check: 1, or 2 (the policy above, and one per day of the same capacity, in one AllowAll)")
	hold := f.Bool("hold", false, "hold one other key's row in an open transaction for the run, with 4 checks waiting on it (a slow request that charges credits)")
	cpuProfile := f.String("cpuprofile", "", "write this process's CPU profile of the run to FILE (go tool pprof)")
	citus := f.Bool("citus", false, "distribute the scratch tables by key (Citus; also done when the citus extension is installed)")
	grants := f.Int64("grants", 0, "grant every key N credits before the run (Config.Grants), for checks that spill from the bucket into grants")
	denyCache := f.Int("deny-cache", 0, "Config.DenyCacheSize: deny keys denied before locally until their retry time (0: off)")
	ledger := f.Bool("ledger", false, "Config.Ledger: a ledger row per allowed check")
	requestIDs := f.Bool("request-ids", false, "give every check a request ID of its own (WithRequestID)")
	noRouting := f.Bool("no-routing", false, "on Citus, send every check through the coordinator (ClientConfig.DisableRouting)")
	prefill := f.Int("prefill", 0, "fill the table with N live rows of the run's prefix before the run (full buckets, as checks left them: the run's --keys are the first of them); at least --keys")
	if _, err := f.parse(args, 0, 0); err != nil {
		return f.fail(err)
	}
	if *conc < 1 || *keys < 1 || *duration <= 0 {
		return f.fail(usagef("--concurrency, --keys and --duration must be positive"))
	}
	if *limits != 1 && *limits != 2 {
		return f.fail(usagef("--limits must be 1 or 2, got %d", *limits))
	}
	if *mode != "coalesce" && *mode != "per-check" {
		return f.fail(usagef("--mode must be coalesce or per-check, got %q", *mode))
	}
	f.storage = *storage
	cfg, err := f.config()
	if err != nil {
		return f.fail(err)
	}
	cfg.Prefix, cfg.Capacity, cfg.Refill, cfg.Interval = "bench", *capacity, *refill, *interval
	cfg.DisableCoalescing = *mode == "per-check"
	cfg.CoalesceConns = *coalesceConns
	cfg.Grants = *grants > 0
	cfg.DenyCacheSize = *denyCache
	cfg.Ledger = *ledger
	if *grants < 0 || *denyCache < 0 {
		return f.fail(usagef("--grants and --deny-cache must be at least 0"))
	}
	if *prefill != 0 && *prefill < *keys {
		return f.fail(usagef("--prefill must be 0 or at least --keys (%d), got %d", *keys, *prefill))
	}
	if *conns == 0 {
		*conns = min(*conc, 200)
	}
	pcfg, err := f.poolConfig()
	if err != nil {
		return f.fail(err)
	}
	rep, err := bench(ctx, c, f, pcfg, cfg, benchRun{conc: *conc, keys: *keys, duration: *duration, cost: *cost, conns: *conns, limits: *limits, citus: *citus, cpuProfile: *cpuProfile, hold: *hold, grants: *grants, requestIDs: *requestIDs, prefill: *prefill, noRouting: *noRouting})
	if err != nil {
		return f.fail(err)
	}
	rep.Contender = fmt.Sprintf("ours-%s-%s", *mode, *storage)
	if *limits == 2 {
		rep.Contender += "-2limits"
	}
	if *grants > 0 {
		rep.Contender += "-grants"
	}
	if *denyCache > 0 {
		rep.Contender += "-denycache"
	}
	if *ledger {
		rep.Contender += "-ledger"
	}
	if *requestIDs {
		rep.Contender += "-requestids"
	}
	out := c.stdout
	if f.json {
		out = c.stderr
	}
	fmt.Fprintf(out, "%s: %d in flight, %d keys, %s, cost %d\n", rep.Contender, rep.Conc, rep.Keys, *duration, *cost)
	fmt.Fprintf(out, "  %.0f checks/s   p50 %.2f ms   p99 %.2f ms   max %.2f ms\n", rep.ChecksPerSec, rep.P50ms, rep.P99ms, rep.MaxMs)
	fmt.Fprintf(out, "  allowed %d   denied %d   errors %d\n", rep.Allowed, rep.Denied, rep.Errors)
	server := "n/a (not a local server)"
	if rep.ServerUsPerCheck > 0 {
		server = fmt.Sprintf("%.1f", rep.ServerUsPerCheck)
	}
	fmt.Fprintf(out, "  CPU per check: client %.1f µs, server %s µs\n", rep.ClientUsPerCheck, server)
	if len(rep.Nodes) > 0 {
		var parts []string
		for _, n := range rep.Nodes {
			v := "n/a"
			if n.UsPerCheck >= 0 {
				v = fmt.Sprintf("%.1f", n.UsPerCheck)
			}
			parts = append(parts, n.Node+" "+v)
		}
		fmt.Fprintf(out, "  server CPU per check by node (µs): %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(out, "  audit: %s\n", rep.Audit)
	fmt.Fprintf(out, "  HOT updates: %.1f%% of %d\n", 100*rep.HotRatio, rep.Updates)
	if rep.PrefillRows > 0 {
		fmt.Fprintf(out, "  prefilled %d rows: table %d MB, indexes %d MB\n", rep.PrefillRows, rep.TableBytes>>20, rep.IndexBytes>>20)
	}
	if f.json {
		f.printJSON(rep)
	}
	if rep.Audit != "ok" {
		return exitError
	}
	return exitOK
}

type benchRun struct {
	conc, keys, conns, limits int
	duration                  time.Duration
	cost                      int64
	grants                    int64 // granted to every key before the run
	requestIDs                bool  // a request ID per check
	prefill                   int   // live rows in the table before the run
	noRouting                 bool  // ClientConfig.DisableRouting
	citus, hold               bool
	cpuProfile                string
}

type benchReport struct {
	Contender    string  `json:"contender"`
	Conc         int     `json:"conc"`
	Keys         int     `json:"keys"`
	Secs         float64 `json:"secs"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Allowed      int64   `json:"allowed"`
	Denied       int64   `json:"denied"`
	Errors       int64   `json:"errors"`
	Audit        string  `json:"audit"`
	HotRatio     float64 `json:"hot_update_ratio"`
	Updates      int64   `json:"updates"`
	Limits       int     `json:"limits"`
	Distributed  bool    `json:"distributed"`
	// With --prefill: the rows put in the table before the run, and the
	// table's and its indexes' size after.
	PrefillRows int64 `json:"prefill_rows,omitempty"`
	TableBytes  int64 `json:"table_bytes,omitempty"`
	IndexBytes  int64 `json:"index_bytes,omitempty"`
	// CPU time per check: this process's, and the database server's
	// processes' when the server runs on this machine (0 otherwise).
	ClientUsPerCheck float64 `json:"client_us_per_check"`
	ServerUsPerCheck float64 `json:"server_us_per_check"`
	// On Citus: the server CPU time per check of each node, the
	// coordinator first (-1: not readable, a node not on this machine);
	// ServerUsPerCheck is then their sum (0 unless all were read).
	Nodes []nodeCPU `json:"nodes,omitempty"`
}

type nodeCPU struct {
	Node       string  `json:"node"`
	UsPerCheck float64 `json:"us_per_check"`
}

func bench(ctx context.Context, c *cli, f *flags, pcfg *pgxpool.Config, cfg pgratelimit.Config, run benchRun) (rep benchReport, err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "pgratelimit_bench_" + hex.EncodeToString(b[:])
	// Setting up and removing the scratch schema is bounded by --timeout;
	// removing it also happens after an interrupt.
	sctx, cancel := f.withTimeout(ctx)
	defer cancel()
	admin, err := pgx.ConnectConfig(sctx, pcfg.ConnConfig.Copy())
	if err != nil {
		return rep, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(sctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return rep, fmt.Errorf("creating scratch schema: %w", err)
	}
	defer func() {
		dctx, cancel := f.withTimeout(context.WithoutCancel(ctx))
		defer cancel()
		_, derr := admin.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		if err == nil && derr != nil {
			err = fmt.Errorf("dropping scratch schema: %w", derr)
		}
	}()
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.MaxConns = int32(run.conns)
	db := stdlib.OpenDB(*pcfg.ConnConfig)
	err = migrations.Up(sctx, db)
	distributed := false
	if err == nil {
		var citusInstalled bool
		if err = db.QueryRowContext(sctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citusInstalled); err == nil && (run.citus || citusInstalled) {
			err = migrations.Distribute(sctx, db)
			distributed = err == nil
		}
	}
	if err == nil && run.grants > 0 {
		_, err = db.ExecContext(sctx, `INSERT INTO pgratelimit_grants (prefix, key, amount)
SELECT $1, 'key-' || i, $2 FROM generate_series(0, $3 - 1) AS i`, cfg.Prefix, run.grants, run.keys)
	}
	db.Close()
	if err != nil {
		return rep, err
	}
	cancel() // set up
	if run.prefill > 0 {
		// Not bounded by --timeout: ten million rows take minutes.
		if err := prefillRows(ctx, c, admin, schema, cfg, run.prefill); err != nil {
			return rep, err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return rep, err
	}
	newLimiter := func(cfg pgratelimit.Config) (*pgratelimit.Limiter, error) { return pgratelimit.New(pool, cfg) }
	if run.noRouting {
		client, err := pgratelimit.NewClient(ctx, pool, pgratelimit.ClientConfig{CoalesceConns: cfg.CoalesceConns, DisableRouting: true})
		if err != nil {
			pool.Close()
			return rep, err
		}
		defer client.Close(context.WithoutCancel(ctx))
		newLimiter = func(cfg pgratelimit.Config) (*pgratelimit.Limiter, error) {
			cfg.CoalesceConns = 0 // the client's
			return client.NewLimiter(cfg)
		}
	}
	l, err := newLimiter(cfg)
	if err != nil {
		pool.Close()
		return rep, err
	}
	var ids atomic.Int64
	check := func(ctx context.Context, key string, cost int64) (bool, error) {
		if run.requestIDs {
			ctx = pgratelimit.WithRequestID(ctx, "r"+strconv.FormatInt(ids.Add(1), 10))
		}
		r, err := l.AllowN(ctx, key, cost)
		return r.Allowed, err
	}
	if run.limits == 2 {
		dayCfg := cfg
		dayCfg.Prefix, dayCfg.Interval = "bench-day", 24*time.Hour
		day, err := newLimiter(dayCfg)
		if err != nil {
			pool.Close()
			return rep, err
		}
		check = func(ctx context.Context, key string, cost int64) (bool, error) {
			m, err := pgratelimit.AllowAll(ctx, pgratelimit.Charge{Limiter: l, Key: key, Cost: cost}, pgratelimit.Charge{Limiter: day, Key: key, Cost: cost})
			return m.Allowed, err
		}
	}
	if run.cpuProfile != "" {
		pf, err := os.Create(run.cpuProfile)
		if err != nil {
			pool.Close()
			return rep, err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			pool.Close()
			return rep, err
		}
		defer pprof.StopCPUProfile()
	}
	var nodes *workers
	if distributed {
		if nodes, err = connectWorkers(ctx, admin); err != nil {
			pool.Close()
			return rep, fmt.Errorf("reading the Citus nodes: %w", err)
		}
		defer nodes.close(context.WithoutCancel(ctx))
	}
	// What each key was allowed, for the audit. Touched before the CPU
	// baselines: ten million keys are 80 MB of page faults. Key names are
	// made per check (keyName): a slice of ten million strings would cost
	// every garbage collection of the run a scan of them.
	allowedCost := make([]atomic.Int64, run.keys)
	for i := range allowedCost {
		allowedCost[i].Store(0)
	}
	keyName := func(k int) string { return "key-" + strconv.Itoa(k) }
	server := serverCPU(ctx, pool)
	var nodesCPU []time.Duration
	if nodes != nil {
		nodesCPU = nodes.cpu(ctx)
	}
	client := clientCPU()

	var allowed, denied, errs atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, run.conc)

	start := time.Now()
	end := start.Add(run.duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var wg sync.WaitGroup
	if run.hold {
		// A transaction that took a token of "held" and stays open for the
		// run, and checks of that key that wait for it (each up to 1s).
		tx, err := pool.Begin(ctx)
		if err != nil {
			return rep, err
		}
		// Ended when the run is (the pool cannot close while it is open).
		context.AfterFunc(runCtx, func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		if _, err := l.AllowNTx(ctx, tx, "held", 1); err != nil {
			return rep, err
		}
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for runCtx.Err() == nil {
					c, cancel := context.WithTimeout(runCtx, time.Second)
					_, _ = l.AllowN(c, "held", 1)
					cancel()
				}
			}()
		}
	}
	for w := range run.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), uint64(start.UnixNano())))
			mine := make([]time.Duration, 0, 1<<14)
			for runCtx.Err() == nil {
				k := rng.IntN(run.keys)
				t0 := time.Now()
				ok, err := check(runCtx, keyName(k), run.cost)
				if err != nil {
					if runCtx.Err() != nil || !time.Now().Before(end) {
						break // the run ended mid-check: not an error of the limiter
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				mine = append(mine, time.Since(t0))
				if ok {
					allowed.Add(1)
					allowedCost[k].Add(run.cost)
				} else {
					denied.Add(1)
				}
			}
			lat[w] = mine
		}()
	}
	// Progress, once a second.
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last int64
		for {
			select {
			case <-done:
				fmt.Fprint(c.stderr, "\r\033[K")
				return
			case <-t.C:
				n := allowed.Load() + denied.Load()
				fmt.Fprintf(c.stderr, "\r\033[K%5.0fs  %8d checks/s  allowed %d  denied %d  errors %d",
					time.Since(start).Seconds(), n-last, allowed.Load(), denied.Load(), errs.Load())
				last = n
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)
	clientUsed := clientCPU() - client
	close(done)
	serverUsed := serverCPU(ctx, pool) - server
	var nodesUsed []time.Duration
	if nodes != nil {
		for i, t := range nodes.cpu(ctx) {
			if t == 0 || nodesCPU[i] == 0 {
				nodesUsed = append(nodesUsed, -1) // not readable
			} else {
				nodesUsed = append(nodesUsed, t-nodesCPU[i])
			}
		}
	}
	pool.Close() // backends exit and flush their statistics

	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	rep = benchReport{
		Conc: run.conc, Keys: run.keys, Secs: math.Round(run.duration.Seconds()*10) / 10,
		ChecksPerSec: math.Round(float64(len(all)) / elapsed.Seconds()),
		P50ms:        pct(0.50), P99ms: pct(0.99), MaxMs: pct(1),
		Allowed: allowed.Load(), Denied: denied.Load(), Errors: errs.Load(), Audit: "ok",
		Limits: run.limits, Distributed: distributed, PrefillRows: int64(run.prefill),
	}
	if n := float64(len(all)); n > 0 {
		rep.ClientUsPerCheck = math.Round(10*float64(clientUsed.Microseconds())/n) / 10
		perCheck := func(d time.Duration) float64 { return math.Round(10*float64(d.Microseconds())/n) / 10 }
		if server > 0 {
			rep.ServerUsPerCheck = perCheck(serverUsed)
		}
		if nodes != nil {
			// On Citus: the coordinator's and each worker's, and server the
			// cluster's sum when every node's could be read.
			rep.Nodes = append(rep.Nodes, nodeCPU{Node: "coordinator", UsPerCheck: rep.ServerUsPerCheck})
			all := server > 0
			for i, d := range nodesUsed {
				nc := nodeCPU{Node: nodes.names[i], UsPerCheck: -1}
				if d >= 0 {
					nc.UsPerCheck = perCheck(d)
					rep.ServerUsPerCheck += nc.UsPerCheck
				} else {
					all = false
				}
				rep.Nodes = append(rep.Nodes, nc)
			}
			if !all {
				rep.ServerUsPerCheck = 0
			}
			rep.ServerUsPerCheck = math.Round(10*rep.ServerUsPerCheck) / 10
		}
	}
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(c.stderr, "first error: %s\n", e)
	}
	// Exactness: no key may have been given more than a bucket allows in the
	// elapsed time (Capacity plus every refill, one more for the edges).
	bound := cfg.Capacity
	if refills := int64(elapsed/cfg.Interval) + 1; refills < (math.MaxInt64-cfg.Capacity-run.grants)/cfg.Refill {
		bound = cfg.Capacity + refills*cfg.Refill + run.grants
	}
	for k := range allowedCost {
		if got := allowedCost[k].Load(); got > bound {
			rep.Audit = fmt.Sprintf("FAILED: %s was allowed %d tokens, more than the %d a bucket allows in %s", keyName(k), got, bound, elapsed.Round(time.Millisecond))
			break
		}
	}
	// HOT updates of the run's table.
	time.Sleep(700 * time.Millisecond) // statistics of exited backends arrive shortly
	table := pgratelimit.DurableTable
	if cfg.Storage == pgratelimit.Ephemeral {
		table = pgratelimit.EphemeralTable
	}
	var upd, hot int64
	if err := admin.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
		schema, table).Scan(&upd, &hot); err == nil && upd > 0 {
		rep.Updates, rep.HotRatio = upd, math.Round(1000*float64(hot)/float64(upd))/1000
	}
	if run.prefill > 0 {
		sizes := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`
		if distributed {
			sizes = `SELECT citus_table_size($1::regclass), citus_total_relation_size($1::regclass) - citus_table_size($1::regclass)`
		}
		name := pgx.Identifier{schema, table}.Sanitize()
		if err := admin.QueryRow(ctx, sizes, name).Scan(&rep.TableBytes, &rep.IndexBytes); err != nil {
			return rep, fmt.Errorf("reading the table's size: %w", err)
		}
	}
	return rep, nil
}

// prefillRows fills the scratch schema's bucket table with n rows of cfg's
// prefix, keys key-0 to key-(n-1), each a full bucket as a check long ago
// left it (refilled on the grid, full again since: expires_at passed, which
// no run's cleanup sees, since the bench runs none), in transactions of a
// million rows, each in random order as checks would have added them (in
// the order of i the keys' index would be half empty: "key-1000000" and on
// go in the middle of "key-100000"'s, every page split leaving the left half
// full and never added to again); then VACUUM ANALYZE and, if the role may,
// CHECKPOINT.
func prefillRows(ctx context.Context, c *cli, admin *pgx.Conn, schema string, cfg pgratelimit.Config, n int) error {
	table := pgratelimit.DurableTable
	if cfg.Storage == pgratelimit.Ephemeral {
		table = pgratelimit.EphemeralTable
	}
	name := pgx.Identifier{schema, table}.Sanitize()
	ins := `INSERT INTO ` + name + ` (prefix, key, tokens, refilled_at, expires_at)
SELECT $1, 'key-' || i, $2, date_bin($3::interval, now() - interval '1 hour', timestamptz 'epoch'), date_bin('1 minute', now() - interval '1 minute', timestamptz 'epoch')
FROM generate_series($4::bigint, $5::bigint) AS i
ORDER BY hashint8(i)`
	start := time.Now()
	const chunk = 1_000_000
	for from := 0; from < n; from += chunk {
		to := min(from+chunk, n) - 1
		if _, err := admin.Exec(ctx, ins, cfg.Prefix, cfg.Capacity, interval(cfg.Interval), from, to); err != nil {
			return fmt.Errorf("prefilling %s: %w", name, err)
		}
		fmt.Fprintf(c.stderr, "\r\033[Kprefill: %d of %d rows, %s", to+1, n, time.Since(start).Round(time.Second))
	}
	fmt.Fprint(c.stderr, "\r\033[K")
	if _, err := admin.Exec(ctx, `VACUUM (ANALYZE) `+name); err != nil { // on Citus, on every shard
		return fmt.Errorf("vacuuming %s: %w", name, err)
	}
	_, _ = admin.Exec(ctx, `CHECKPOINT`) // needs superuser or pg_checkpoint: else skipped
	return nil
}

// interval is d as PostgreSQL interval input, in seconds and microseconds
// (PostgreSQL 14 reads each field as 32 bits).
func interval(d time.Duration) string {
	return fmt.Sprintf("%d seconds %d microseconds", d/time.Second, (d % time.Second).Microseconds())
}

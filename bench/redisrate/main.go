// Command redisrate is the peer benchmark's redis_rate contender: go-redis/redis_rate
// (GCRA in a Lua script, one EVALSHA round trip per check) on Redis, under the same
// workload as the others: CONC checks in flight, each of one token from a key drawn
// uniformly from KEYS, for SECS seconds, with a limit that never denies.
//
// Usage: REDIS_ADDR=127.0.0.1:6379 redisrate CONC KEYS SECS
//
// It prints one JSON line: checks, checks_per_sec, p50_ms, p99_ms, errors.
// It lives in bench/'s own Go module so that go-redis never reaches the library's go.mod.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: redisrate CONC KEYS SECS")
		os.Exit(2)
	}
	conc, err1 := strconv.Atoi(os.Args[1])
	keys, err2 := strconv.Atoi(os.Args[2])
	secs, err3 := strconv.ParseFloat(os.Args[3], 64)
	if err1 != nil || err2 != nil || err3 != nil || conc < 1 || keys < 1 || secs <= 0 {
		fmt.Fprintln(os.Stderr, "usage: redisrate CONC KEYS SECS (positive numbers)")
		os.Exit(2)
	}
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	// One connection per check in flight, as pgbench and the other contenders have.
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: conc, MinIdleConns: conc})
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		fmt.Fprintln(os.Stderr, "redis:", err)
		os.Exit(1)
	}
	all, errs, elapsed := run(ctx, redis_rate.NewLimiter(rdb), conc, keys, time.Duration(secs*float64(time.Second)))
	rdb.Close()
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(float64(len(all))*p))].Microseconds()) / 1000
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"contender": "redis_rate", "conc": conc, "keys": keys, "secs": secs,
		"checks": len(all), "elapsed_s": elapsed, "checks_per_sec": float64(len(all)) / elapsed,
		"p50_ms": pct(0.5), "p99_ms": pct(0.99), "errors": errs,
	})
}

// run has conc workers check keys drawn uniformly from keys for d, with a
// limit that never denies, and returns the latency of every check that
// returned, the number that failed, and the seconds it took. The first
// failure goes to stderr.
func run(ctx context.Context, limiter *redis_rate.Limiter, conc, keys int, d time.Duration) (all []time.Duration, errors int, elapsed float64) {
	limit := redis_rate.Limit{Rate: 1 << 30, Burst: 1 << 30, Period: time.Hour}
	keyNames := make([]string, keys)
	for i := range keyNames {
		keyNames[i] = "key-" + strconv.Itoa(i+1)
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			lat := make([]time.Duration, 0, 1<<14)
			errs := 0
			var first error
			for time.Now().Before(end) {
				key := keyNames[rng.IntN(keys)]
				t := time.Now()
				if _, err := limiter.Allow(ctx, key, limit); err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			errors += errs
			if firstErr == nil {
				firstErr = first
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed = time.Since(start).Seconds()
	if firstErr != nil {
		fmt.Fprintln(os.Stderr, "first error:", firstErr)
	}
	return all, errors, elapsed
}

// Command redissem is the peer benchmark's redis_sem contender: the usual
// Redis counting semaphore (a sorted set per key, member the lease ID, score
// its expiry), under the same workload as `pgratelimit bench --leases`: CONC
// workers, each acquiring a slot of a key drawn uniformly from KEYS (MAX
// slots per key) and releasing it at once, for SECS seconds; a denied
// acquisition is tried again on another key at once, as ours is.
//
// Acquire is one EVALSHA of a Lua script: drop the expired members
// (ZREMRANGEBYSCORE), and if fewer than MAX are left (ZCARD), add the lease
// with its expiry as score (ZADD) and move the key's own expiry (PEXPIRE),
// by Redis's clock (TIME). Release is one ZREM. No fencing token, and
// nothing survives a restart of Redis (it runs without persistence).
//
// Usage: REDIS_ADDR=127.0.0.1:6379 redissem CONC KEYS SECS MAX
//
// It prints one JSON line: pairs (acquired and released), pairs_per_sec,
// p50_ms and p99_ms of a pair, denied, errors, elapsed_s and audit (that the
// workers never held more than MAX slots of a key at once, counted between
// an acquisition's answer and its release's request).
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
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ttl is how long a slot counts unless released: longer than any pair
// takes, as pgratelimit bench --leases's.
const ttl = 30 * time.Second

// acquire takes a slot of KEYS[1] for ARGV[3] if fewer than ARGV[1] are
// held, for ARGV[2] milliseconds; 1 when taken, 0 when not.
var acquire = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: redissem CONC KEYS SECS MAX")
		os.Exit(2)
	}
	conc, err1 := strconv.Atoi(os.Args[1])
	keys, err2 := strconv.Atoi(os.Args[2])
	secs, err3 := strconv.ParseFloat(os.Args[3], 64)
	maxSlots, err4 := strconv.Atoi(os.Args[4])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || conc < 1 || keys < 1 || secs <= 0 || maxSlots < 1 {
		fmt.Fprintln(os.Stderr, "usage: redissem CONC KEYS SECS MAX (positive numbers)")
		os.Exit(2)
	}
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	// One connection per acquisition in flight, as the other contenders have.
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: conc, MinIdleConns: conc})
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		fmt.Fprintln(os.Stderr, "redis:", err)
		os.Exit(1)
	}
	if err := acquire.Load(ctx, rdb).Err(); err != nil {
		rdb.Close()
		fmt.Fprintln(os.Stderr, "redis: loading the script:", err)
		os.Exit(1)
	}
	b := &bench{rdb: rdb, keys: keys, max: int64(maxSlots), held: make([]atomic.Int64, keys)}
	all, elapsed := b.run(ctx, conc, time.Duration(secs*float64(time.Second)))
	rdb.Close()
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(float64(len(all))*p))].Microseconds()) / 1000
	}
	audit := "ok"
	if msg := b.over.Load(); msg != nil {
		audit = *msg
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"contender": "redis_sem", "conc": conc, "keys": keys, "secs": secs, "lease_max": maxSlots,
		"pairs": len(all), "elapsed_s": elapsed, "pairs_per_sec": float64(len(all)) / elapsed,
		"p50_ms": pct(0.5), "p99_ms": pct(0.99), "denied": b.denied.Load(), "errors": b.errs.Load(), "audit": audit,
	})
}

// bench is a run: the client, the keys, and its tally.
type bench struct {
	rdb          *redis.Client
	keys         int
	max          int64
	held         []atomic.Int64 // slots the workers hold of each key
	over         atomic.Pointer[string]
	denied, errs atomic.Int64
	firstErr     atomic.Pointer[string]
}

// run has conc workers acquire and release slots for d, and returns the
// latency of every pair and the seconds it took. The first error goes to
// stderr.
func (b *bench) run(ctx context.Context, conc int, d time.Duration) (all []time.Duration, elapsed float64) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			lat := make([]time.Duration, 0, 1<<14)
			for n := 0; time.Now().Before(end); n++ {
				k := rng.IntN(b.keys)
				t := time.Now()
				if b.pair(ctx, k, "w"+strconv.Itoa(w)+"-"+strconv.Itoa(n)) {
					lat = append(lat, time.Since(t))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed = time.Since(start).Seconds()
	if e := b.firstErr.Load(); e != nil {
		fmt.Fprintln(os.Stderr, "first error:", *e)
	}
	return all, elapsed
}

// pair acquires a slot of key number k as id and releases it, and says
// whether both happened.
func (b *bench) pair(ctx context.Context, k int, id string) bool {
	key := "sem:key-" + strconv.Itoa(k)
	got, err := acquire.Run(ctx, b.rdb, []string{key}, b.max, ttl.Milliseconds(), id).Int()
	if err != nil {
		b.fail(err)
		return false
	}
	if got == 0 {
		b.denied.Add(1)
		return false
	}
	if n := b.held[k].Add(1); n > b.max {
		msg := fmt.Sprintf("FAILED: %s had %d slots held at once by the workers, more than %d", key, n, b.max)
		b.over.CompareAndSwap(nil, &msg)
	}
	b.held[k].Add(-1) // before the release is sent: Redis still counts it
	if err := b.rdb.ZRem(ctx, key, id).Err(); err != nil {
		b.fail(err)
		return false
	}
	return true
}

func (b *bench) fail(err error) {
	b.errs.Add(1)
	msg := err.Error()
	b.firstErr.CompareAndSwap(nil, &msg)
}

package integration

import (
	"context"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// BenchmarkAllowN measures checks through one Limiter from parallel
// goroutines (-cpu sets how many; SetParallelism multiplies), in both modes,
// on many keys and on one hot key, for both storages. Compare runs with benchstat; for
// throughput against other limiters use 'pgratelimit bench' (see README).
func BenchmarkAllowN(b *testing.B) {
	for _, mode := range []string{"coalesce", "per-check"} {
		for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
			for _, keys := range []int{10000, 1} {
				benchAllowN(b, mode, storage, keys)
			}
		}
	}
}

func benchAllowN(b *testing.B, mode string, storage pgratelimit.Storage, keys int) {
	b.Run(mode+"/"+storage.String()+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
		s := testdb.NewSchema(b)
		l, err := pgratelimit.New(s.Pool(b, 32), pgratelimit.Config{
			Prefix: "bench", Capacity: 1 << 40, Refill: 1, Interval: time.Hour, Storage: storage,
			DisableCoalescing: mode == "per-check",
		})
		if err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(16)
		cpu := clientCPU(b)
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				key := "k" + strconv.Itoa(rand.IntN(keys))
				if _, err := l.AllowN(ctx, key, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
		cpu.report()
	})
}

// BenchmarkLeasePair measures lease pairs through one Semaphore from
// parallel goroutines: Acquire of weight 1 on one of 10,000 keys, then
// Release of that lease, coalesced, as 'pgratelimit bench --workload leases'
// runs them.
func BenchmarkLeasePair(b *testing.B) {
	const keys = 10000
	s := testdb.NewSchema(b)
	sem, err := pgratelimit.NewSemaphore(s.Pool(b, 32), pgratelimit.SemaphoreConfig{
		Prefix: "bench", Max: 1 << 20, TTL: time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(16)
	cpu := clientCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := "k" + strconv.Itoa(rand.IntN(keys))
			r, err := sem.Acquire(ctx, key, 1)
			if err == nil && !r.Allowed {
				b.Errorf("acquire %s: denied", key)
			}
			if err == nil {
				err = sem.Release(ctx, key, r.Lease.ID)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	cpu.report()
}

// cpuSince is the CPU time this process (the client: the PostgreSQL
// servers are processes of their own) has used since a benchmark's timer
// was reset.
type cpuSince struct {
	b     *testing.B
	start time.Duration
}

// clientCPU resets b's timer and starts counting the process's CPU time.
func clientCPU(b *testing.B) cpuSince {
	b.ResetTimer()
	return cpuSince{b, processCPU(b)}
}

// report reports the process's CPU time per op since clientCPU as
// client-µs/op: user and system time, whatever other processes run, so
// comparable between runs on a busy machine where ns/op is not.
func (c cpuSince) report() {
	c.b.StopTimer()
	c.b.ReportMetric(float64((processCPU(c.b)-c.start).Microseconds())/float64(c.b.N), "client-µs/op")
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package bench

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// load is the run's workers' tally.
type load struct {
	allowed, denied, errs atomic.Int64
	ids                   atomic.Int64 // the last request ID given (--request-ids)
	firstErr              atomic.Value // the first error's text
	// lat holds each worker's latencies of the checks that returned.
	lat [][]time.Duration
	// allowedCost is what each key was allowed in all, for the audit.
	allowedCost []atomic.Int64
	elapsed     time.Duration
}

// newLoad makes the tally of a run. Every key's count is touched here, before
// the CPU baselines: ten million keys are 80 MB of page faults. (Key names
// are made per check, by keyName: a slice of ten million strings would cost
// every garbage collection of the run a scan of them.)
func newLoad(o Options) *load {
	ld := &load{lat: make([][]time.Duration, o.Concurrency), allowedCost: make([]atomic.Int64, o.Keys)}
	for i := range ld.allowedCost {
		ld.allowedCost[i].Store(0)
	}
	return ld
}

// run runs o.Concurrency workers for o.Duration, drawing progress on w
// each second. It returns when the workers are done, with a function that
// stops the progress.
func (ld *load) run(ctx context.Context, w io.Writer, o Options, ch *checker) (stopProgress func()) {
	start := time.Now()
	end := start.Add(o.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var wg sync.WaitGroup
	for i := range o.Concurrency {
		wg.Go(func() { ld.work(runCtx, i, start, end, o, ch) })
	}
	done := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		ld.progress(w, start, done)
	}()
	wg.Wait()
	ld.elapsed = time.Since(start)
	return func() {
		close(done)
		<-progressDone
	}
}

// work is worker w: it checks keys drawn uniformly until the run ends,
// timing the checks allowed (with --leases: acquire+release pairs), and
// those denied too unless --leases.
func (ld *load) work(runCtx context.Context, w int, start, end time.Time, o Options, ch *checker) {
	rng := mrand.New(mrand.NewPCG(uint64(w), uint64(start.UnixNano())))
	mine := make([]time.Duration, 0, 1<<14)
	for runCtx.Err() == nil {
		k := rng.IntN(o.Keys)
		ctx := runCtx
		if o.RequestIDs {
			ctx = pgratelimit.WithRequestID(ctx, "r"+strconv.FormatInt(ld.ids.Add(1), 10))
		}
		t0 := time.Now()
		ok, err := ch.check(ctx, k, o.Cost)
		if err != nil {
			if runCtx.Err() != nil || !time.Now().Before(end) {
				break // the run ended mid-check: not an error of the limiter
			}
			ld.errs.Add(1)
			ld.firstErr.CompareAndSwap(nil, err.Error())
			continue
		}
		if ok || ch.timeDenied {
			mine = append(mine, time.Since(t0))
		}
		if ok {
			ld.allowed.Add(1)
			ld.allowedCost[k].Add(o.Cost)
		} else {
			ld.denied.Add(1)
		}
	}
	ld.lat[w] = mine
}

// progress redraws a line of progress on w once a second until done is
// closed, then clears it.
func (ld *load) progress(w io.Writer, start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-done:
			fmt.Fprint(w, "\r\033[K")
			return
		case <-t.C:
			n := ld.allowed.Load() + ld.denied.Load()
			fmt.Fprintf(w, "\r\033[K%5.0fs  %8d checks/s  allowed %d  denied %d  errors %d",
				time.Since(start).Seconds(), n-last, ld.allowed.Load(), ld.denied.Load(), ld.errs.Load())
			last = n
		}
	}
}

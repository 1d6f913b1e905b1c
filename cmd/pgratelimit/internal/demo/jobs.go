package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/cmd/pgratelimit/internal/human"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// The jobs card: long jobs of which a client may run jobsMax at once, each
// holding a lease of a Semaphore (jobsPrefix) that it extends every TTL/3
// while it runs and releases when it ends. A job killed stops its heartbeat
// without releasing: its slot comes back when its lease expires, by itself.
const (
	jobsPrefix = "demo-jobs"
	jobsMax    = 3
	// defaultJobsTTL is the leases' TTL, and defaultJobFor how long a job
	// runs: three TTLs, so that its heartbeats are what keep its slot.
	defaultJobsTTL = 10 * time.Second
	defaultJobFor  = 30 * time.Second
	// releaseTimeout bounds the release of a job that ends.
	releaseTimeout = 5 * time.Second
)

// jobsConfig is how the jobs card's jobs run: the TTL of their leases and
// how long each runs (0: the defaults; tests shorten them).
type jobsConfig struct {
	ttl, runFor time.Duration
}

// jobs runs the jobs card's jobs, each holding a lease of sem.
type jobs struct {
	sem         *pgratelimit.Semaphore
	ttl, runFor time.Duration
	log         *slog.Logger

	mu   sync.Mutex
	all  map[string]*job // by lease ID: the running ones, and the killed ones until their lease is gone
	wg   sync.WaitGroup  // the running jobs' goroutines
	done chan struct{}   // closed by stop: the running jobs release their leases and end
	once sync.Once
}

// job is a job and its lease, as last acquired or extended.
type job struct {
	key    string
	lease  pgratelimit.Lease
	ends   time.Time
	killed bool          // its heartbeat stopped: its lease is left to expire
	kill   chan struct{} // closed to kill it
}

func newJobs(pool *pgxpool.Pool, log *slog.Logger, c jobsConfig) (*jobs, error) {
	j := &jobs{ttl: c.ttl, runFor: c.runFor, log: log, all: make(map[string]*job), done: make(chan struct{})}
	if j.ttl == 0 {
		j.ttl = defaultJobsTTL
	}
	if j.runFor == 0 {
		j.runFor = defaultJobFor
	}
	sem, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: jobsPrefix, Max: jobsMax, TTL: j.ttl})
	if err != nil {
		return nil, err
	}
	j.sem = sem
	return j, nil
}

// start acquires a slot of key and, if it got one, starts a job holding it.
func (j *jobs) start(ctx context.Context, key string) (pgratelimit.LeaseResult, error) {
	r, err := j.sem.Acquire(ctx, key, 1)
	if err != nil || !r.Allowed {
		return r, err
	}
	jb := &job{key: key, lease: r.Lease, ends: time.Now().Add(j.runFor), kill: make(chan struct{})}
	j.mu.Lock()
	j.all[r.Lease.ID] = jb
	j.mu.Unlock()
	j.wg.Go(func() { j.run(jb) })
	return r, nil
}

// run is a job: it extends its lease every TTL/3 until it ends, then
// releases it; killed, it just stops; stopped (the demo ends), it releases.
func (j *jobs) run(jb *job) {
	beat := time.NewTicker(j.ttl / 3)
	defer beat.Stop()
	end := time.NewTimer(time.Until(jb.ends))
	defer end.Stop()
	for {
		select {
		case <-jb.kill:
			return
		case <-j.done:
			j.release(jb, "the demo stopped")
			return
		case <-end.C:
			j.release(jb, "its job finished")
			return
		case <-beat.C:
			select {
			case <-jb.kill: // (killed meanwhile: no heartbeat more)
				return
			default:
			}
			if !j.extend(jb) {
				return
			}
		}
	}
}

// extend is a job's heartbeat; false when its lease is no longer held (it
// expired: the job lost its slot and stops).
func (j *jobs) extend(jb *job) bool {
	ctx, cancel := context.WithTimeout(context.Background(), j.ttl/3)
	defer cancel()
	l, err := j.sem.Extend(ctx, jb.key, jb.lease.ID)
	switch {
	case errors.Is(err, pgratelimit.ErrLeaseExpired) || errors.Is(err, pgratelimit.ErrLeaseNotFound):
		j.log.Warn("a job lost its lease: it stops", "key", jb.key, "token", jb.lease.Token, "error", err)
		j.forget(jb.lease.ID)
		return false
	case err != nil:
		j.log.Warn("a job's heartbeat failed; trying again at the next", "key", jb.key, "token", jb.lease.Token, "error", err)
		return true
	}
	j.mu.Lock()
	jb.lease = l
	j.mu.Unlock()
	return true
}

// release releases a job's lease, and forgets the job.
func (j *jobs) release(jb *job, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := j.sem.Release(ctx, jb.key, jb.lease.ID); err != nil {
		j.log.Warn("a job's release failed: its slot comes back when its lease expires", "key", jb.key, "token", jb.lease.Token, "error", err)
	} else {
		j.log.Info("a job released its lease", "key", jb.key, "token", jb.lease.Token, "why", why)
	}
	j.forget(jb.lease.ID)
}

func (j *jobs) forget(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.all, id)
}

// kill stops the heartbeat of key's oldest running job without releasing
// its lease, and returns that lease; false when no job runs.
func (j *jobs) kill(key string) (pgratelimit.Lease, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var oldest *job
	for _, jb := range j.all {
		if jb.key == key && !jb.killed && (oldest == nil || jb.lease.Token < oldest.lease.Token) {
			oldest = jb
		}
	}
	if oldest == nil {
		return pgratelimit.Lease{}, false
	}
	oldest.killed = true
	close(oldest.kill)
	return oldest.lease, true
}

// reset kills every job of key and releases every live lease of key
// (those of other holders too: the CLI's), so that the card starts with
// every slot free.
func (j *jobs) reset(ctx context.Context, key string) error {
	j.mu.Lock()
	for id, jb := range j.all {
		if jb.key == key {
			if !jb.killed {
				jb.killed = true
				close(jb.kill)
			}
			delete(j.all, id)
		}
	}
	j.mu.Unlock()
	ls, err := j.sem.Leases(ctx, key)
	if err != nil {
		return err
	}
	for _, l := range ls {
		if err := j.sem.Release(ctx, key, l.ID); err != nil && !errors.Is(err, pgratelimit.ErrLeaseExpired) {
			return err
		}
	}
	return nil
}

// stop ends the running jobs, which release their leases, and waits for
// them.
func (j *jobs) stop() {
	j.once.Do(func() { close(j.done) })
	j.wg.Wait()
}

// jobsJSON is the jobs card's state: the semaphore's policy, and the units
// of the key's live leases: Held in all, Running of them held by the
// demo's running jobs, Killed by its killed ones (their lease left to
// expire), the rest by other holders (the CLI, say). Each lease, with its
// token and expiry, is on the key's page of the operator UI.
type jobsJSON struct {
	Prefix      string `json:"prefix"`
	Max         int64  `json:"max"`
	TTLMS       int64  `json:"ttl_ms"`
	HeartbeatMS int64  `json:"heartbeat_ms"`
	JobMS       int64  `json:"job_ms"`
	Held        int64  `json:"held"`
	Running     int64  `json:"running"`
	Killed      int64  `json:"killed"`
}

// state reads key's live leases, and forgets the killed jobs whose lease
// is gone.
func (j *jobs) state(ctx context.Context, key string) (jobsJSON, error) {
	st := jobsJSON{Prefix: jobsPrefix, Max: jobsMax, TTLMS: j.ttl.Milliseconds(), HeartbeatMS: (j.ttl / 3).Milliseconds(),
		JobMS: j.runFor.Milliseconds()}
	ls, err := j.sem.Leases(ctx, key)
	if err != nil {
		return st, err
	}
	live := make(map[string]bool, len(ls))
	for _, l := range ls {
		st.Held += l.Weight
		live[l.ID] = true
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for id, jb := range j.all {
		switch {
		case jb.key != key:
		case jb.killed && !live[id]:
			delete(j.all, id)
		case jb.killed:
			st.Killed += jb.lease.Weight
		case live[id]:
			st.Running += jb.lease.Weight
		}
	}
	return st, nil
}

// serveJobStart starts a job for the client if a slot is free: 200 with
// what it holds, else 429 with Retry-After (when the soonest lease
// expires) and why.
func (a *app) serveJobStart(w http.ResponseWriter, r *http.Request, key string) error {
	res, err := a.jobs.start(r.Context(), key)
	if err != nil {
		return err
	}
	if !res.Allowed {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((res.RetryAfter+time.Second-1)/time.Second), 10))
		return writeMessage(w, http.StatusTooManyRequests, fmt.Sprintf("Denied: all %d slots are held (%d of %d), so no job started. The soonest lease expires in %s; a job that ends releases its slot sooner.",
			res.Limit, res.Limit-res.Remaining, res.Limit, human.Duration(res.RetryAfter)))
	}
	return writeMessage(w, http.StatusOK, fmt.Sprintf("Started a job with lease token %d: it runs %s, extending its lease every %s, then releases it. %d of %d slots held.",
		res.Lease.Token, human.Duration(a.jobs.runFor), human.Duration(a.jobs.ttl/3), res.Limit-res.Remaining, res.Limit))
}

// serveJobKill kills the client's oldest running job: no more heartbeats,
// and no release.
func (a *app) serveJobKill(w http.ResponseWriter, r *http.Request, key string) error {
	msg := "No running job to kill: start one first."
	if l, ok := a.jobs.kill(key); ok {
		msg = fmt.Sprintf("Killed the job with lease token %d without releasing its lease: no more heartbeats, so its slot comes back when the lease expires, in %s.",
			l.Token, human.Duration(max(time.Until(l.ExpiresAt), 0)))
	}
	return writeMessage(w, http.StatusOK, msg)
}

// serveJobsReset stops the client's jobs and releases its leases.
func (a *app) serveJobsReset(w http.ResponseWriter, r *http.Request, key string) error {
	if err := a.jobs.reset(r.Context(), key); err != nil {
		return err
	}
	return writeMessage(w, http.StatusOK, fmt.Sprintf("Started over: every job stopped and every lease released, %d slots free.", jobsMax))
}

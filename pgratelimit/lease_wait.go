package pgratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgratelimit/pgratelimit/internal/notify"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
)

// Waiting for a lease: a denied Wait sleeps until a release of its key is
// notified (LISTEN/NOTIFY: a release from a full key notifies the prefix's
// channel with the key, in its transaction, so only a committed release
// wakes anyone), until the soonest time enough leases expire, or until a
// jittered poll, whichever comes first, then tries again. One connection
// per Semaphore listens while it has waiters (a connection of its own,
// outside the pool, closed once no one has waited for a while). Where it
// cannot listen (through PgBouncer in transaction mode, or any pooler: the
// backend that answers is not the one the connection was opened with) waiters
// poll with a jittered backoff, from pollMin up to pollMax, never past the
// soonest expiry.

const (
	// pollMin and pollMax bound the backoff of waiters without
	// notifications.
	pollMin = 20 * time.Millisecond
	pollMax = time.Second
	// pollListening is how often a waiter that is notified of releases
	// tries anyway: for a notification lost while the listener reconnects,
	// and for weights bigger than the key's leases' (see lease.Part.Take).
	pollListening = 2 * time.Second
	// listenIdle is how long a listener stays connected without waiters.
	listenIdle = 30 * time.Second
	// listenRetry is how long after a failed listener the next waiter may
	// start one.
	listenRetry = 5 * time.Second
)

// Wait acquires a lease of weight units of key, waiting for free units as
// long as it takes, within ctx and SemaphoreConfig.MaxWait: it tries, and
// while denied sleeps until a release of the key is notified, until enough
// leases would expire, or until a jittered poll, then tries again (a woken
// waiter may find the units taken by another first). Past MaxWait it
// returns the last denied result with ErrWaitTooLong; when ctx ends, ctx's
// error. Errors of Acquire are returned as they are. Notifications need a
// direct connection to PostgreSQL: through PgBouncer in transaction mode
// waiters poll (see README, Concurrency leases). In a transaction (In) Wait
// is ErrInvalidConfig: the key's lock would be held while waiting.
func (s *Semaphore) Wait(ctx context.Context, key string, weight int64) (LeaseResult, error) {
	if s.tx != nil {
		return LeaseResult{}, badArg(ErrInvalidArgument, "Wait in the caller's transaction (In) would hold %s's lock while waiting; use Acquire", quoteKey(key))
	}
	start := time.Now()
	backoff := pollMin
	for {
		w := s.wake.add(key)
		r, err := s.Acquire(ctx, key, weight)
		if err != nil || r.Allowed {
			s.wake.remove(w)
			return r, err
		}
		left := time.Duration(1<<63 - 1)
		if s.cfg.MaxWait > 0 {
			if left = s.cfg.MaxWait - time.Since(start); left <= 0 {
				s.wake.remove(w)
				return r, fmt.Errorf("%w: no %d units of %s free within Config.MaxWait %s", ErrWaitTooLong, weight, quoteKey(key), s.cfg.MaxWait)
			}
		}
		sleep := backoff
		if s.wake.listening() {
			sleep = pollListening
		} else {
			backoff = min(2*backoff, pollMax)
		}
		if sleep = jitter(sleep); r.RetryAfter < sleep {
			sleep = r.RetryAfter + jitter(pollMin) // enough leases expire first
		}
		sleep = min(sleep, left)
		err = w.sleep(ctx, sleep)
		s.wake.remove(w)
		if err != nil {
			return r, err
		}
	}
}

// jitter is a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// waiter is a Wait call's registration with its semaphore's waker.
type waiter struct {
	key  string
	wake chan struct{} // closed or sent to on a release of key
}

// sleep sleeps d, or until w is woken or ctx ends (then it returns ctx's
// error).
func (w *waiter) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-w.wake:
	}
	return nil
}

// waker listens for the releases of one prefix's leases and wakes the
// waiters of their keys.
type waker struct {
	pool    *pgxpool.Pool
	channel string

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // by key
	n       int                             // waiters
	running bool                            // a listener goroutine runs
	listen  bool                            // it listens (LISTEN done)
	retryAt time.Time                       // no listener before then
	never   bool                            // this pool cannot listen
}

func newWaker(pool *pgxpool.Pool, prefix string) *waker {
	return &waker{pool: pool, channel: sqlgen.LeaseChannel(prefix), waiters: make(map[string]map[*waiter]struct{})}
}

// add registers a waiter of key, starting the listener if none runs.
func (k *waker) add(key string) *waiter {
	w := &waiter{key: key, wake: make(chan struct{}, 1)}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.waiters[key] == nil {
		k.waiters[key] = make(map[*waiter]struct{})
	}
	k.waiters[key][w] = struct{}{}
	k.n++
	if !k.running && !k.never && time.Now().After(k.retryAt) {
		k.running = true
		go k.run()
	}
	return w
}

func (k *waker) remove(w *waiter) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ws := k.waiters[w.key]; ws != nil {
		if _, ok := ws[w]; ok {
			delete(ws, w)
			k.n--
		}
		if len(ws) == 0 {
			delete(k.waiters, w.key)
		}
	}
}

func (k *waker) listening() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.listen
}

// wakeKey wakes the waiters of key.
func (k *waker) wakeKey(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for w := range k.waiters[key] {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// run listens until no one has waited for listenIdle, or the connection
// fails (the next waiter then starts a listener again, after listenRetry);
// through a pooler it never listens again.
func (k *waker) run() {
	idleSince := time.Now()
	err := notify.Listen(context.Background(), k.pool.Config().ConnConfig.Copy(), notify.Listener{
		Channel: k.channel,
		Ready: func() {
			k.mu.Lock()
			k.listen = true
			k.mu.Unlock()
		},
		Got: k.wakeKey,
		Idle: func() bool {
			k.mu.Lock()
			busy := k.n > 0
			k.mu.Unlock()
			if busy {
				idleSince = time.Now()
			}
			return time.Since(idleSince) > listenIdle
		},
	})
	k.mu.Lock()
	k.running, k.listen = false, false
	switch {
	case errors.Is(err, notify.ErrPooler):
		k.never = true
	case err != nil:
		k.retryAt = time.Now().Add(listenRetry)
	}
	k.mu.Unlock()
}

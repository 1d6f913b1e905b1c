package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgratelimit/pgratelimit/internal/testdb"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// newSemaphore is pgratelimit.NewSemaphore on pool in the suite's mode.
func newSemaphore(t *testing.T, pool *pgxpool.Pool, cfg pgratelimit.SemaphoreConfig) *pgratelimit.Semaphore {
	t.Helper()
	cfg.DisableCoalescing = cfg.DisableCoalescing || perCheck
	s, err := pgratelimit.NewSemaphore(pool, cfg)
	require.NoError(t, err)
	return s
}

// The semantics of one key, by a fake clock: acquire up to Max, denied with
// the soonest expiry, release, extend, expiry, ErrLeaseExpired and
// ErrLeaseNotFound, Leases, and replays by request ID.
func TestLeaseSemantics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, storage := range []pgratelimit.Storage{pgratelimit.Durable, pgratelimit.Ephemeral} {
		t.Run(storage.String(), func(t *testing.T) {
			clock := newClock()
			s := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "jobs", Max: 3, TTL: 10 * time.Second, Storage: storage, Clock: clock.Now})

			a, err := s.Acquire(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, a.Allowed)
			require.Equal(t, int64(2), a.Limit-a.Remaining)
			require.Equal(t, int64(3), a.Limit)
			require.Equal(t, "k", a.Lease.Key)
			require.Equal(t, t0, a.Lease.AcquiredAt.UTC())
			require.Equal(t, t0.Add(10*time.Second), a.Lease.ExpiresAt.UTC())
			require.NotEmpty(t, a.Lease.ID)

			clock.Add(2 * time.Second)
			b, err := s.Acquire(ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, b.Allowed)
			require.Greater(t, b.Lease.Token, a.Lease.Token)

			c, err := s.Acquire(ctx, "k", 1)
			require.NoError(t, err)
			require.False(t, c.Allowed)
			require.Equal(t, int64(3), c.Limit-c.Remaining)
			require.Equal(t, 8*time.Second, c.RetryAfter)

			ls, err := s.Leases(ctx, "k")
			require.NoError(t, err)
			require.Len(t, ls, 2)
			require.Equal(t, a.Lease.ID, ls[0].ID)

			// Extend b; a expires at 10s.
			clock.Add(5 * time.Second)
			eb, err := s.Extend(ctx, "k", b.Lease.ID)
			require.NoError(t, err)
			require.Equal(t, t0.Add(17*time.Second), eb.ExpiresAt.UTC())
			clock.Set(10 * time.Second)
			c, err = s.Acquire(ctx, "k", 2)
			require.NoError(t, err)
			require.True(t, c.Allowed, "a's units are free at its expiry")

			require.ErrorIs(t, s.Release(ctx, "k", a.Lease.ID), pgratelimit.ErrLeaseExpired)
			_, err = s.Extend(ctx, "k", a.Lease.ID)
			require.ErrorIs(t, err, pgratelimit.ErrLeaseExpired)
			_, err = s.Extend(ctx, "k", "never")
			require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)

			require.NoError(t, s.Release(ctx, "k", b.Lease.ID))
			require.NoError(t, s.Release(ctx, "k", b.Lease.ID), "releasing twice is nil")
			_, err = s.Extend(ctx, "k", b.Lease.ID)
			require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)
			ls, err = s.Leases(ctx, "k")
			require.NoError(t, err)
			require.Len(t, ls, 1)
			require.Equal(t, c.Lease.ID, ls[0].ID)

			// Exactly once: the same request ID returns the same lease.
			rctx := pgratelimit.WithRequestID(ctx, "req-1")
			r1, err := s.Acquire(rctx, "k", 1)
			require.NoError(t, err)
			require.True(t, r1.Allowed)
			require.Equal(t, "req-1", r1.Lease.ID)
			r2, err := s.Acquire(rctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, r1.Lease, r2.Lease)
			_, err = s.Acquire(rctx, "k", 2)
			require.ErrorIs(t, err, pgratelimit.ErrRequestMismatch)
		})
	}
}

// A lease and two buckets in one AllowAll: all or nothing. A full
// semaphore spends no tokens; a bucket that denies leaves no lease.
func TestLeaseAllowAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	perSec, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "sec", Capacity: 5, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	perDay, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "day", Capacity: 2, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "slots", Max: 1, TTL: time.Minute})
	charges := []pgratelimit.Charge{s.Charge("u", 1), perSec.Charge("u", 1), perDay.Charge("u", 1)}

	m, err := pgratelimit.AllowAll(ctx, charges...)
	require.NoError(t, err)
	require.True(t, m.Allowed)
	require.Len(t, m.Leases, 3)
	l := m.Leases[0]
	require.NotEmpty(t, l.ID)
	require.Equal(t, pgratelimit.Lease{}, m.Leases[1])
	require.Equal(t, pgratelimit.Result{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: time.Minute}, m.Results[0])
	require.Equal(t, int64(4), m.Results[1].Remaining)

	// The slot is taken: nothing is spent.
	m, err = pgratelimit.AllowAll(ctx, charges...)
	require.NoError(t, err)
	require.False(t, m.Allowed)
	require.False(t, m.Results[0].Allowed)
	require.True(t, m.Results[1].Allowed)
	require.Equal(t, int64(4), m.Results[1].Remaining)
	require.InDelta(t, float64(time.Minute), float64(m.RetryAfter), float64(5*time.Second))
	require.Equal(t, pgratelimit.Lease{}, m.Leases[0])
	for _, lim := range []*pgratelimit.Limiter{perSec, perDay} {
		r, err := lim.Peek(ctx, "u")
		require.NoError(t, err)
		require.Equal(t, lim.Config().Capacity-1, r.Remaining, "a denied call spent nothing")
	}

	// The slot is free but the daily bucket is empty: no lease is taken.
	require.NoError(t, s.Release(ctx, "u", l.ID))
	r, err := perDay.AllowN(ctx, "u", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	m, err = pgratelimit.AllowAll(ctx, charges...)
	require.NoError(t, err)
	require.False(t, m.Allowed)
	require.True(t, m.Results[0].Allowed, "the slot alone was free")
	require.Equal(t, int64(1), m.Results[0].Remaining, "and is still")
	require.False(t, m.Results[2].Allowed)
	ls, err := s.Leases(ctx, "u")
	require.NoError(t, err)
	require.Empty(t, ls)

	// Charges of one semaphore's key add up to one lease; a semaphore and
	// a limiter of one prefix cannot share a call; a charge needs one of
	// them.
	_, err = pgratelimit.AllowAll(ctx, s.Charge("v", 1), s.Charge("v", 1))
	require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
	same, err := newLimiterOn(pool, pgratelimit.Config{Prefix: "slots", Capacity: 5, Refill: 1, Interval: time.Hour})
	require.NoError(t, err)
	_, err = pgratelimit.AllowAll(ctx, s.Charge("v", 1), same.Charge("v", 1))
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	_, err = pgratelimit.AllowAll(ctx, pgratelimit.Charge{})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
}

// A lease taken in the caller's transaction exists only if it commits,
// with pgx and with database/sql; Wait refuses to wait there.
func TestLeaseInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "tx", Max: 1, TTL: time.Minute})

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	r, err := s.In(pgratelimit.PgxTx(tx)).Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	_, err = s.In(pgratelimit.PgxTx(tx)).Wait(ctx, "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidArgument)
	require.NoError(t, tx.Rollback(ctx))
	ls, err := s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, ls, "rolled back: no lease")

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	r, err = s.In(pgratelimit.SQLTx(stx)).Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.NoError(t, stx.Commit())
	ls, err = s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, r.Lease.ID, ls[0].ID)

	// A release in a rolled-back transaction releases nothing.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.In(pgratelimit.PgxTx(tx)).Release(ctx, "k", r.Lease.ID))
	require.NoError(t, tx.Rollback(ctx))
	d, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)

	// Tx.AllowAll runs a Semaphore's charge in tx too: rolled back, no
	// lease.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	m, err := pgratelimit.PgxTx(tx).AllowAll(ctx, s.Charge("all", 1))
	require.NoError(t, err)
	require.True(t, m.Allowed)
	require.NoError(t, tx.Rollback(ctx))
	ls, err = s.Leases(ctx, "all")
	require.NoError(t, err)
	require.Empty(t, ls, "Tx.AllowAll rolled back: no lease")
}

// commitEater is a connection whose replies are lost once it has seen a
// COMMIT confirmed while armed: the transaction committed, the caller sees
// a broken connection.
type commitEater struct {
	net.Conn
	armed *atomic.Bool
	then  func() // if not nil, called when it eats a reply, which then reads as timed out
}

func (c commitEater) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.armed.Load() && bytes.Contains(b[:n], []byte("COMMIT\x00")) {
		c.armed.Store(false)
		c.Conn.Close()
		if c.then != nil {
			c.then()
			return 0, os.ErrDeadlineExceeded // as when pgx stops a read for an ended context
		}
		return 0, errors.New("the reply was lost")
	}
	return n, err
}

// Exactly once: an acquisition with a request ID whose reply is lost
// committed its lease; the retry gets the same lease and takes no other
// unit.
func TestLeaseLostReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var armed atomic.Bool
	cfg := testdb.NewSchema(t).Config.Copy()
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return commitEater{Conn: c, armed: &armed}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "once", Max: 2, TTL: time.Minute})

	rctx := pgratelimit.WithRequestID(ctx, "job-42")
	armed.Store(true)
	_, err = s.Acquire(rctx, "k", 1)
	require.Error(t, err, "the reply was lost")
	require.False(t, armed.Load(), "a COMMIT was confirmed")

	r, err := s.Acquire(rctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, "job-42", r.Lease.ID)
	require.Equal(t, int64(1), r.Limit-r.Remaining, "the retry took no other unit")
	ls, err := s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []pgratelimit.Lease{r.Lease}, ls)
}

// An acquisition whose context ends as its transaction commits returns the
// context's error, though it took its lease (docs/leases.md, "Errors and
// retries"): with a request ID, the retry returns that lease and takes no
// other unit, and Release frees it.
func TestLeaseContextEndsAtCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var armed atomic.Bool
	var cancelCall atomic.Pointer[context.CancelFunc]
	cfg := testdb.NewSchema(t).Config.Copy()
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return commitEater{Conn: c, armed: &armed, then: func() { (*cancelCall.Load())() }}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "ctx", Max: 2, TTL: time.Minute})

	id := pgratelimit.WithRequestID(ctx, "job-7")
	cctx, cancel := context.WithCancel(id)
	defer cancel()
	cancelCall.Store(&cancel)
	armed.Store(true)
	_, err = s.Acquire(cctx, "k", 1)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, armed.Load(), "a COMMIT was confirmed")
	ls, err := s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Len(t, ls, 1, "the lease was taken")

	r, err := s.Acquire(id, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.Equal(t, ls[0], r.Lease)
	require.Equal(t, int64(1), r.Limit-r.Remaining, "the retry took no other unit")
	require.NoError(t, s.Release(ctx, "k", "job-7"))
	require.NoError(t, s.Release(ctx, "k", "job-7"), "a release is safe to retry")
	ls, err = s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, ls)
}

// Wait is woken by a release (a notification: far sooner than the expiry,
// and sooner than the poll of a waiter that listens); it gives up past
// MaxWait.
func TestLeaseWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "w", Max: 1, TTL: time.Minute, MaxWait: 20 * time.Second})
	held, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, held.Allowed)

	got := make(chan pgratelimit.LeaseResult, 1)
	errs := make(chan error, 1)
	start := time.Now()
	go func() {
		r, err := s.Wait(ctx, "k", 1)
		got <- r
		errs <- err
	}()
	time.Sleep(300 * time.Millisecond)
	released := time.Now()
	require.NoError(t, s.Release(ctx, "k", held.Lease.ID))
	r := <-got
	require.NoError(t, <-errs)
	require.True(t, r.Allowed)
	woke := time.Since(released)
	t.Logf("woken %s after the release (waited %s)", woke.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	require.Less(t, woke, time.Second, "woken by the release's notification, not by a poll")

	short := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "w", Max: 1, TTL: time.Minute, MaxWait: 300 * time.Millisecond})
	_, err = short.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	d, err := short.Wait(ctx, "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrWaitTooLong)
	require.False(t, d.Allowed)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.Wait(cctx, "k", 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Through PgBouncer in transaction mode no notification can arrive: a
// waiter polls, and gets the unit soon after the release all the same.
func TestLeaseWaitThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSemaphore(t, pgbouncerPool(t), pgratelimit.SemaphoreConfig{Prefix: "w", Max: 1, TTL: time.Minute})
	held, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, held.Allowed)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = s.Release(ctx, "k", held.Lease.ID)
	}()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := s.Wait(wctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
}

// An expired lease is remembered for one TTL (ErrLeaseExpired), then
// forgotten; cleanup deletes a key's row only once every lease in it is
// forgotten, so it never changes an answer.
func TestLeaseCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	clock := newClock()
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "c", Max: 5, TTL: 10 * time.Second, Clock: clock.Now})
	e := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "c", Max: 5, TTL: 10 * time.Second, Clock: clock.Now, Storage: pgratelimit.Ephemeral})
	old, err := s.Acquire(ctx, "k", 2)
	require.NoError(t, err)
	eold, err := e.Acquire(ctx, "k", 1)
	require.NoError(t, err)

	clock.Add(15 * time.Second) // expired 5s ago: remembered
	cleanup := func() {
		t.Helper()
		_, err := deleteExpired(ctx, pool, pgratelimit.CleanerConfig{Clock: clock.Now})
		require.NoError(t, err)
	}
	cleanup()
	require.ErrorIs(t, s.Release(ctx, "k", old.Lease.ID), pgratelimit.ErrLeaseExpired)
	_, err = e.Extend(ctx, "k", eold.Lease.ID)
	require.ErrorIs(t, err, pgratelimit.ErrLeaseExpired)
	live, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), live.Limit-live.Remaining)
	require.ErrorIs(t, s.Release(ctx, "k", old.Lease.ID), pgratelimit.ErrLeaseExpired, "still remembered after a write")

	clock.Add(10 * time.Second) // old expired 15s ago: forgotten, written or not
	require.NoError(t, s.Release(ctx, "k", old.Lease.ID))
	_, err = e.Extend(ctx, "k", eold.Lease.ID)
	require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)

	clock.Add(2 * time.Minute)
	live2, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	cleanup()
	var durable, ephemeral int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgratelimit_buckets WHERE prefix = 'c'),
       (SELECT count(*) FROM pgratelimit_ephemeral_buckets WHERE prefix = 'c')`).Scan(&durable, &ephemeral))
	require.Equal(t, 1, durable, "the row of a live lease stays")
	require.Equal(t, 0, ephemeral, "the row whose leases are all forgotten is deleted")
	_, err = e.Extend(ctx, "k", eold.Lease.ID)
	require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound, "the same answer after cleanup")
	ls, err := s.Leases(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []pgratelimit.Lease{live2.Lease}, ls)
}

// A coalesced batch inserts a key's row only for an acquisition on a key
// the semaphore has not seen: a release or an extension of a key without a
// row, and an acquisition of a key whose row cleanup deleted since, are
// deferred and run again with the INSERT, with the answers they would get
// anyway.
func TestLeaseKeyRowGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "gone", Max: 1, TTL: time.Minute})
	require.NoError(t, s.Release(ctx, "never", "x"), "a release on a key without a row")
	_, err := s.Extend(ctx, "never", "x")
	require.ErrorIs(t, err, pgratelimit.ErrLeaseNotFound)

	for i := range 3 {
		r, err := s.Acquire(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, r.Allowed, "try %d", i)
		require.NoError(t, s.Release(ctx, "k", r.Lease.ID))
		// What cleanup does once the key's leases are all forgotten.
		_, err = pool.Exec(ctx, `DELETE FROM pgratelimit_buckets WHERE prefix = 'gone' AND key = 'k'`)
		require.NoError(t, err)
	}
	r, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	denied, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, denied.Allowed, "the row made again holds the lease")
}

// A Limiter and a Semaphore with the same Prefix and Storage would share
// their keys' rows: a semaphore's operation on a row that holds a
// limiter's bucket is ErrInvalidConfig, and changes nothing, whichever
// came first.
func TestLeaseSharedPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	lim, err := pgratelimit.New(pool, pgratelimit.Config{Prefix: "shared", Capacity: 5, Refill: 1, Interval: time.Minute})
	require.NoError(t, err)
	sem := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: "shared", Max: 2, TTL: time.Minute})

	r, err := lim.Allow(ctx, "bucket")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	_, err = sem.Acquire(ctx, "bucket", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)

	l, err := sem.Acquire(ctx, "leases", 1)
	require.NoError(t, err)
	require.True(t, l.Allowed)
	_, err = lim.Allow(ctx, "leases") // cannot tell: it reads no leases
	require.NoError(t, err)
	require.ErrorIs(t, sem.Release(ctx, "leases", l.Lease.ID), pgratelimit.ErrInvalidConfig)
	peek, err := lim.Peek(ctx, "bucket")
	require.NoError(t, err)
	require.Equal(t, int64(4), peek.Remaining, "the bucket is untouched")
}

// Lease IDs of any text (quotes, backslashes, braces, commas, non-ASCII)
// survive the leases column, in both coalescing modes.
func TestLeaseOddIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	for _, perCheck := range []bool{false, true} {
		s := newSemaphore(t, pool, pgratelimit.SemaphoreConfig{Prefix: fmt.Sprintf("odd-%v", perCheck), Max: 3, TTL: time.Minute, DisableCoalescing: perCheck})
		ids := []string{`q"u\o\\te`, `{a,b} "c"`, "tab\there\n\u00e9 é ✓"}
		for _, id := range ids {
			r, err := s.Acquire(pgratelimit.WithRequestID(ctx, id), "k", 1)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.Equal(t, id, r.Lease.ID)
		}
		ls, err := s.Leases(ctx, "k")
		require.NoError(t, err)
		var got []string
		for _, l := range ls {
			got = append(got, l.ID)
		}
		require.ElementsMatch(t, ids, got)
		for _, id := range ids {
			require.NoError(t, s.Release(ctx, "k", id))
		}
		ls, err = s.Leases(ctx, "k")
		require.NoError(t, err)
		require.Empty(t, ls)
	}
}

// Invalid input is refused before any database access.
func TestLeaseInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unreachablePool(t)
	for _, cfg := range []pgratelimit.SemaphoreConfig{
		{Max: 1, TTL: time.Second},
		{Prefix: "p", TTL: time.Second},
		{Prefix: "p", Max: 1},
		{Prefix: "p", Max: 1, TTL: time.Nanosecond},
		{Prefix: "p", Max: 1, TTL: time.Second, Storage: 7},
		{Prefix: "p", Max: 1, TTL: time.Second, MaxWait: -1},
	} {
		_, err := pgratelimit.NewSemaphore(pool, cfg)
		require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig, "%+v", cfg)
	}
	_, err := pgratelimit.NewSemaphore(nil, pgratelimit.SemaphoreConfig{Prefix: "p", Max: 1, TTL: time.Second})
	require.ErrorIs(t, err, pgratelimit.ErrInvalidConfig)
	s, err := pgratelimit.NewSemaphore(pool, pgratelimit.SemaphoreConfig{Prefix: "p", Max: 2, TTL: time.Second})
	require.NoError(t, err)
	_, err = s.Acquire(ctx, "", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
	_, err = s.Acquire(ctx, "k", 0)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidCost)
	_, err = s.Acquire(ctx, "k", 3)
	require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
	_, err = s.Wait(ctx, "k", 3)
	require.ErrorIs(t, err, pgratelimit.ErrCostExceedsCapacity)
	_, err = s.Acquire(pgratelimit.WithRequestID(ctx, ""), "k", 1)
	require.ErrorIs(t, err, pgratelimit.ErrInvalidRequestID)
	require.ErrorIs(t, s.Release(ctx, "k", ""), pgratelimit.ErrInvalidRequestID)
	_, err = s.Extend(ctx, "k", "a\x00b")
	require.ErrorIs(t, err, pgratelimit.ErrInvalidRequestID)
	_, err = s.Leases(ctx, "k\x00")
	require.ErrorIs(t, err, pgratelimit.ErrInvalidKey)
}

// The lease instruments: units held (acquired and not released, each lease
// once) and denials, by prefix.
func TestLeaseMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	s := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "m", Max: 3, TTL: time.Minute, MeterProvider: mp})
	rctx := pgratelimit.WithRequestID(ctx, "r")
	a, err := s.Acquire(rctx, "k", 2)
	require.NoError(t, err)
	_, err = s.Acquire(rctx, "k", 2) // a replay: counted once
	require.NoError(t, err)
	_, err = s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	d, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.NoError(t, s.Release(ctx, "k", a.Lease.ID))
	require.NoError(t, s.Release(ctx, "k", a.Lease.ID))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range sum.DataPoints {
					prefix, _ := p.Attributes.Value("pgratelimit.prefix")
					require.Equal(t, "m", prefix.AsString())
					got[m.Name] += p.Value
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"pgratelimit.leases.held": 1, "pgratelimit.leases.denied": 1}, got)
}

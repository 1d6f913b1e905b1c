package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// A Result says what the grants paid of a charge and whether it is a
// replay, as the account model decided it: no ledger read, no lookup of
// the request ID.
func TestResultFromGrantsAndReplayed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := billing(t, newPool(t), "result", newClock()) // 100 in the bucket
	id := func(s string) context.Context { return pgratelimit.WithRequestID(ctx, s) }

	r, err := l.AllowN(ctx, "k", 60)
	require.NoError(t, err)
	require.Equal(t, pgratelimit.Result{Allowed: true, Limit: 100, Remaining: 40, ResetAfter: r.ResetAfter}, r, "the bucket paid it all")
	_, err = l.Grant(ctx, "k", 50, time.Time{})
	require.NoError(t, err)

	first, err := l.AllowN(id("a"), "k", 70) // 40 from the bucket, 30 from the grant
	require.NoError(t, err)
	require.True(t, first.Allowed)
	require.False(t, first.Replayed)
	require.Equal(t, int64(30), first.FromGrants)
	require.Equal(t, int64(20), first.Granted)
	again, err := l.AllowN(id("a"), "k", 70)
	require.NoError(t, err)
	require.True(t, again.Replayed, "the same request ID: a replay")
	require.Equal(t, int64(30), again.FromGrants, "what the grants paid the first time")
	first.Replayed = true
	require.Equal(t, first, again, "the first Result, bit for bit")

	denied, err := l.AllowN(id("b"), "k", 30)
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	require.False(t, denied.Replayed)
	require.Zero(t, denied.FromGrants, "a denial takes nothing")

	s, err := l.Settle(ctx, "k", "a", 50) // 20 back, to the grant first
	require.NoError(t, err)
	require.False(t, s.Replayed)
	require.Equal(t, int64(-20), s.FromGrants, "given back to the grant")
	require.Equal(t, int64(40), s.Granted)
	s2, err := l.Settle(ctx, "k", "a", 50)
	require.NoError(t, err)
	require.True(t, s2.Replayed)
	require.Equal(t, int64(-20), s2.FromGrants, "a replay says it again")

	d, err := l.Debit(ctx, "k", 45) // 0 in the bucket: 40 from the grant, 5 owed
	require.NoError(t, err)
	require.Equal(t, int64(40), d.FromGrants)
	require.Equal(t, int64(-5), d.Remaining)

	p, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	require.False(t, p.Replayed)
	require.Zero(t, p.FromGrants)
	rf, err := l.Refund(id("refund-1"), "k", 10)
	require.NoError(t, err)
	require.False(t, rf.Replayed)
	require.Zero(t, rf.FromGrants, "a refund goes to the bucket")
	rf2, err := l.Refund(id("refund-1"), "k", 10)
	require.NoError(t, err)
	require.True(t, rf2.Replayed)
	require.Equal(t, rf.Remaining, rf2.Remaining)

	m, err := pgratelimit.AllowAll(id("all"), l.Charge("m", 10))
	require.NoError(t, err)
	require.False(t, m.Results[0].Replayed)
	m, err = pgratelimit.AllowAll(id("all"), l.Charge("m", 10))
	require.NoError(t, err)
	require.True(t, m.Results[0].Replayed)
}

// A LeaseResult says whether the acquisition is a replay of its request
// ID's live lease.
func TestLeaseResultReplayed(t *testing.T) {
	t.Parallel()
	ctx := pgratelimit.WithRequestID(context.Background(), "job-1")
	s := newSemaphore(t, newPool(t), pgratelimit.SemaphoreConfig{Prefix: "replayed", Max: 2, TTL: time.Hour})
	first, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, first.Allowed)
	require.False(t, first.Replayed)
	again, err := s.Acquire(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Lease, again.Lease)
	require.Equal(t, int64(1), again.Limit-again.Remaining, "taken once")
	other, err := s.Acquire(context.Background(), "k", 1)
	require.NoError(t, err)
	require.True(t, other.Allowed)
	require.False(t, other.Replayed)
	denied, err := s.Acquire(context.Background(), "k", 1)
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	require.False(t, denied.Replayed)
}

package pgratelimit

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// poolState is what the limiters of one pool share: the coalescer, and
// whether the bucket tables are distributed (Citus), found at first use.
type poolState struct {
	maxConns int
	co       *coalescer
	// dist is 0 until known, then 1 for plain tables, 2 for distributed.
	dist      atomic.Int32
	detecting sync.Mutex // one detection at a time
}

// The state of each pool; an entry goes when its pool is garbage collected.
var pools struct {
	sync.Mutex
	m map[weak.Pointer[pgxpool.Pool]]*poolState
}

// poolStateFor returns pool's state. coalesceConns > 0 makes sure its
// coalescer runs at least that many batches at once (capped at MaxConns).
func poolStateFor(pool *pgxpool.Pool, coalesceConns int) *poolState {
	maxConns := int(pool.Config().MaxConns)
	wp := weak.Make(pool)
	pools.Lock()
	defer pools.Unlock()
	if pools.m == nil {
		pools.m = make(map[weak.Pointer[pgxpool.Pool]]*poolState)
	}
	ps := pools.m[wp]
	if ps == nil {
		ps = &poolState{maxConns: maxConns}
		pools.m[wp] = ps
		runtime.AddCleanup(pool, func(wp weak.Pointer[pgxpool.Pool]) {
			pools.Lock()
			delete(pools.m, wp)
			pools.Unlock()
		}, wp)
	}
	if coalesceConns > 0 {
		slots := max(min(coalesceConns, maxConns), 1)
		if ps.co == nil {
			ps.co = newCoalescer(slots, maxConns)
		} else {
			ps.co.atLeast(slots)
		}
	}
	return ps
}

// distributed says whether the bucket tables are distributed tables of
// Citus, asking the database the first time (and again after a failure,
// which counts as not distributed).
func (ps *poolState) distributed(ctx context.Context, pool *pgxpool.Pool) bool {
	if d := ps.dist.Load(); d != 0 {
		return d == 2
	}
	ps.detecting.Lock()
	defer ps.detecting.Unlock()
	if d := ps.dist.Load(); d != 0 {
		return d == 2
	}
	var citus, dist bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL`).Scan(&citus); err != nil {
		return false
	}
	if citus {
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
WHERE logicalrelid IN (to_regclass('`+DurableTable+`'), to_regclass('`+EphemeralTable+`')))`).Scan(&dist)
		if err != nil {
			return false
		}
	}
	if dist {
		ps.dist.Store(2)
		if ps.co != nil {
			// One row per batch: let as many run at once as the pool
			// allows, as checks of their own would.
			ps.co.mu.Lock()
			ps.co.oneRow = true
			ps.co.slots = max(ps.co.slots, ps.maxConns/2)
			ps.co.mu.Unlock()
		}
	} else {
		ps.dist.Store(1)
	}
	return dist
}

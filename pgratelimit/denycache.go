package pgratelimit

import (
	"sync"
	"time"
)

// The deny cache (Config.DenyCacheSize): once a key has been denied a cost
// with RetryAfter r, later AllowN checks of that key with at least that cost
// are denied by this process without a transaction until r has passed. The
// bucket cannot have gained the tokens meanwhile, since refills come no
// sooner than r, unless something else gives them back: a refund, a reset
// or a grant. This process's own (through any limiter of the client with the
// same Prefix) clear the entry; another process's are not seen until r has
// passed.

// denyCache remembers the keys recently denied, up to a size.
type denyCache struct {
	size int
	mu   sync.RWMutex
	m    map[string]denial
}

// denial is a key's last denial: checks of at least cost are denied until
// until, and the bucket is full at full (by the process's clock).
type denial struct {
	cost        int64
	until, full time.Time
	r           Result
}

func newDenyCache(size int) *denyCache {
	return &denyCache{size: size, m: make(map[string]denial, min(size, 1024))}
}

// lookup returns the local denial of a check of cost on key at now, if the
// cache has one.
func (c *denyCache) lookup(key string, cost int64, now time.Time) (Result, bool) {
	c.mu.RLock()
	d, ok := c.m[key]
	c.mu.RUnlock()
	if !ok || cost < d.cost || !now.Before(d.until) {
		return Result{}, false
	}
	r := d.r
	r.RetryAfter = d.until.Sub(now)
	r.ResetAfter = max(d.full.Sub(now), 0)
	return r, true
}

// store remembers the denial r of a check of cost on key that was sent at
// sent: the database decided it at sent or later, so until sent+RetryAfter
// it would deny the same check again.
func (c *denyCache) store(key string, cost int64, r Result, sent time.Time) {
	if r.RetryAfter <= 0 || r.RetryAfter == InfDuration {
		return
	}
	now := sent
	d := denial{cost: cost, until: sent.Add(r.RetryAfter), full: sent.Add(r.ResetAfter), r: r}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok && len(c.m) >= c.size {
		c.evictLocked(now)
	}
	c.m[key] = d
}

// evictLocked makes room for one entry: it deletes the expired entries among
// the first few the map yields (in random order), or else one of them.
func (c *denyCache) evictLocked(now time.Time) {
	const look = 8
	n, evicted := 0, false
	var victim string
	for k, d := range c.m {
		if !now.Before(d.until) {
			delete(c.m, k)
			evicted = true
		}
		if n == 0 {
			victim = k
		}
		if n++; n == look {
			break
		}
	}
	if !evicted {
		delete(c.m, victim)
	}
}

// forget drops key's entry: its bucket may hold more than when it was
// denied.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}

package pgratelimit

import (
	"sync"
	"sync/atomic"
)

// maxKnownRows bounds the keys a semaphore remembers (knownRows): past it,
// it starts again from none.
const maxKnownRows = 1 << 16

// knownRows are keys whose row a semaphore has seen (an operation of its
// own locked it), so that its coalesced acquisitions of them skip the
// INSERT of the row (engine.Charge.NoInsert), which costs a batch as much
// as the lock. It is only ever a matter of speed: a key whose row cleanup
// has deleted since (its leases all forgotten) is deferred by its batch and
// runs again with the INSERT.
type knownRows struct {
	keys sync.Map // key -> struct{}
	n    atomic.Int64
}

func (k *knownRows) has(key string) bool {
	_, ok := k.keys.Load(key)
	return ok
}

func (k *knownRows) add(key string) {
	if k.has(key) {
		return
	}
	if k.n.Add(1) > maxKnownRows {
		k.keys.Clear()
		k.n.Store(1)
	}
	k.keys.Store(key, struct{}{})
}

package pgratelimit

import "sync"

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
	mu   sync.Mutex
	keys map[string]struct{}
}

func (k *knownRows) has(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.keys[key]
	return ok
}

func (k *knownRows) add(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys == nil || len(k.keys) >= maxKnownRows {
		k.keys = make(map[string]struct{})
	}
	k.keys[key] = struct{}{}
}

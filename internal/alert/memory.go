package alert

import (
	"sync"
	"time"
)

// memorySize bounds the keys a Memory remembers.
const memorySize = 4096

// Memory remembers, for up to memorySize keys and periods, lines that the
// database said had fired: a charge that could only fire those needs no
// read (an exhausted key denied again and again costs no extra round
// trip). It only ever learns from committed state (what a transaction of
// the limiter's own read, or fired and then committed: Observer.Committed),
// so it never skips a line that has not fired.
// Safe for concurrent use; the zero value is empty.
type Memory struct {
	mu    sync.Mutex
	known map[memKey]uint64
}

type memKey struct {
	prefix, key string
	start       int64 // the period's start, Unix microseconds
}

func keyOf(prefix, key string, start time.Time) memKey {
	return memKey{prefix: prefix, key: key, start: start.UnixMicro()}
}

// Known is the mask of lines known to have fired for key in the period
// that starts at start.
func (m *Memory) Known(prefix, key string, start time.Time) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.known[keyOf(prefix, key, start)]
}

// Learn notes that the lines of mask have fired for key in the period that
// starts at start. Past memorySize keys, it forgets others first.
func (m *Memory) Learn(prefix, key string, start time.Time, mask uint64) {
	if mask == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := keyOf(prefix, key, start)
	if m.known == nil {
		m.known = make(map[memKey]uint64)
	}
	if _, ok := m.known[k]; !ok && len(m.known) >= memorySize {
		// Forget an eighth, whichever map order gives: entries of past
		// periods are as good as gone, and a forgotten one costs a read.
		n := memorySize / 8
		for old := range m.known {
			delete(m.known, old)
			if n--; n == 0 {
				break
			}
		}
	}
	m.known[k] |= mask
}

// Package keylock serialises work per key (a sandbox ID, an image digest), so work on one key
// never waits for another key's slow calls.
package keylock

import "sync"

// Map is a set of mutexes by key. The zero value is ready to use. Idle keys take no memory.
type Map struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	sync.Mutex
	holders int // holding or waiting
}

// Lock locks key and returns the function that unlocks it.
func (m *Map) Lock(key string) (unlock func()) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e, ok := m.locks[key]
	if !ok {
		e = &entry{}
		m.locks[key] = e
	}
	e.holders++
	m.mu.Unlock()

	e.Lock()
	return func() {
		e.Unlock()
		m.mu.Lock()
		e.holders--
		if e.holders == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
}

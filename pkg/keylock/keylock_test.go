package keylock

import (
	"sync"
	"testing"
	"time"
)

func TestSameKeyIsExclusive(t *testing.T) {
	var m Map
	var wg sync.WaitGroup
	inside, maxInside := 0, 0
	var mu sync.Mutex
	for range 20 {
		wg.Go(func() {
			unlock := m.Lock("k")
			mu.Lock()
			inside++
			maxInside = max(maxInside, inside)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
			unlock()
		})
	}
	wg.Wait()
	if maxInside != 1 {
		t.Fatalf("%d holders at once", maxInside)
	}
	if len(m.locks) != 0 {
		t.Fatalf("idle keys kept: %d", len(m.locks))
	}
}

func TestDifferentKeysDoNotWait(t *testing.T) {
	var m Map
	unlockA := m.Lock("a")
	defer unlockA()
	done := make(chan struct{})
	go func() {
		m.Lock("b")()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("key b waited for key a")
	}
}

package imagestore

import (
	"context"
	"sync"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// pullFlights lets concurrent pulls of one key share one download: the first caller starts it, the
// others wait for its result. The download runs on a context of its own, cancelled only when every
// caller waiting for it has given up; the last one to leave waits for the cancelled pull to clean
// up, so that its RPC ends with nothing left behind.
type pullFlights struct {
	mu      sync.Mutex
	flights map[string]*pullFlight
}

type pullFlight struct {
	done    chan struct{}
	img     *store.Image
	err     error
	waiters int
	cancel  context.CancelFunc
}

func (f *pullFlights) do(ctx context.Context, key string, pull func(context.Context) (*store.Image, error)) (*store.Image, error) {
	f.mu.Lock()
	fl, ok := f.flights[key]
	if !ok {
		if f.flights == nil {
			f.flights = map[string]*pullFlight{}
		}
		// The pull keeps the first caller's values (logging, tracing), not its deadline.
		pullCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		fl = &pullFlight{done: make(chan struct{}), cancel: cancel}
		f.flights[key] = fl
		go func() {
			fl.img, fl.err = pull(pullCtx)
			cancel()
			f.forget(key, fl)
			close(fl.done)
		}()
	}
	fl.waiters++
	f.mu.Unlock()

	select {
	case <-fl.done:
		return fl.img, fl.err
	case <-ctx.Done():
	}
	f.mu.Lock()
	fl.waiters--
	last := fl.waiters == 0
	if last && f.flights[key] == fl {
		// Nobody wants it any more; a new caller starts afresh rather than join a cancelled pull.
		delete(f.flights, key)
	}
	f.mu.Unlock()
	if last {
		fl.cancel()
		<-fl.done
	}
	return nil, ctx.Err()
}

func (f *pullFlights) forget(key string, fl *pullFlight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flights[key] == fl {
		delete(f.flights, key)
	}
}

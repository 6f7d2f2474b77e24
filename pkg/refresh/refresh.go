// Package refresh keeps a value that is costly to compute (a process to run, a directory tree to
// walk) fresh enough for frequent readers: it is computed at most once per interval, and callers
// that arrive while it is being computed share that computation.
package refresh

import (
	"context"
	"sync"
	"time"
)

// Value is a periodically recomputed value. The zero value is not usable; use New.
type Value[T any] struct {
	interval time.Duration
	compute  func(context.Context) (T, error)
	timeout  time.Duration

	mu       sync.Mutex
	last     Result[T]
	inflight chan struct{}
}

// Result is one computation's outcome.
type Result[T any] struct {
	Value T
	Err   error
	At    time.Time
}

// New returns a Value recomputed by compute at most once per interval; each computation gets its
// own context bounded by timeout, so a reader giving up does not cancel it for the others.
func New[T any](interval, timeout time.Duration, compute func(context.Context) (T, error)) *Value[T] {
	return &Value[T]{interval: interval, timeout: timeout, compute: compute}
}

// Get returns the last result if it is younger than the interval, and otherwise waits for a new
// one (or for ctx).
func (v *Value[T]) Get(ctx context.Context) Result[T] {
	v.mu.Lock()
	if !v.last.At.IsZero() && time.Since(v.last.At) < v.interval {
		defer v.mu.Unlock()
		return v.last
	}
	wait := v.inflight
	if wait == nil {
		wait = make(chan struct{})
		v.inflight = wait
		go v.run(wait)
	}
	v.mu.Unlock()

	select {
	case <-wait:
	case <-ctx.Done():
		return Result[T]{Err: ctx.Err(), At: time.Now()}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.last
}

func (v *Value[T]) run(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), v.timeout)
	defer cancel()
	value, err := v.compute(ctx)
	v.mu.Lock()
	v.last = Result[T]{Value: value, Err: err, At: time.Now()}
	v.inflight = nil
	v.mu.Unlock()
	close(done)
}

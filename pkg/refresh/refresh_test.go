package refresh

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestComputesOncePerInterval(t *testing.T) {
	var calls atomic.Int32
	v := New(time.Hour, time.Second, func(context.Context) (int, error) { return int(calls.Add(1)), nil })
	for range 3 {
		if r := v.Get(context.Background()); r.Value != 1 || r.Err != nil {
			t.Fatalf("got %+v", r)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("computed %d times", calls.Load())
	}
}

func TestRecomputesWhenStale(t *testing.T) {
	var calls atomic.Int32
	v := New(time.Nanosecond, time.Second, func(context.Context) (int, error) { return int(calls.Add(1)), nil })
	v.Get(context.Background())
	time.Sleep(time.Millisecond)
	if r := v.Get(context.Background()); r.Value != 2 {
		t.Fatalf("got %+v", r)
	}
}

func TestConcurrentCallersShareOneComputation(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	v := New(time.Hour, 10*time.Second, func(context.Context) (int, error) {
		calls.Add(1)
		<-release
		return 7, nil
	})
	var wg sync.WaitGroup
	results := make([]Result[int], 10)
	for i := range results {
		wg.Go(func() { results[i] = v.Get(context.Background()) })
	}
	// Let every caller reach the wait before the computation ends.
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	if calls.Load() != 1 {
		t.Fatalf("computed %d times", calls.Load())
	}
	for _, r := range results {
		if r.Value != 7 {
			t.Fatalf("result %+v", r)
		}
	}
}

func TestCallerDeadlineDoesNotCancelTheComputation(t *testing.T) {
	release := make(chan struct{})
	v := New(time.Hour, 10*time.Second, func(ctx context.Context) (string, error) {
		select {
		case <-release:
			return "done", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if r := v.Get(ctx); !errors.Is(r.Err, context.DeadlineExceeded) {
		t.Fatalf("impatient caller got %+v", r)
	}
	close(release)
	if r := v.Get(context.Background()); r.Value != "done" || r.Err != nil {
		t.Fatalf("patient caller got %+v", r)
	}
}

func TestErrorsAreCachedToo(t *testing.T) {
	var calls atomic.Int32
	boom := errors.New("boom")
	v := New(time.Hour, time.Second, func(context.Context) (int, error) { calls.Add(1); return 0, boom })
	v.Get(context.Background())
	if r := v.Get(context.Background()); !errors.Is(r.Err, boom) || calls.Load() != 1 {
		t.Fatalf("got %+v after %d calls", r, calls.Load())
	}
}

package imagestore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// waitForWaiters blocks until n callers wait for key's flight.
func waitForWaiters(t *testing.T, f *pullFlights, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.mu.Lock()
		fl := f.flights[key]
		joined := fl != nil && fl.waiters == n
		f.mu.Unlock()
		if joined {
			return
		}
	}
	t.Fatalf("%d callers never joined the flight", n)
}

func TestConcurrentCallersShareOneFlight(t *testing.T) {
	var f pullFlights
	var runs atomic.Int32
	release := make(chan struct{})
	pull := func(context.Context) (*store.Image, error) {
		runs.Add(1)
		<-release
		return &store.Image{ID: "sha256:shared"}, nil
	}
	const callers = 8
	var wg sync.WaitGroup
	ids := make([]string, callers)
	for i := range callers {
		wg.Go(func() {
			img, err := f.do(context.Background(), "ref", pull)
			if err == nil {
				ids[i] = img.ID
			}
		})
	}
	waitForWaiters(t, &f, "ref", callers)
	close(release)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("%d pulls ran", runs.Load())
	}
	for i, id := range ids {
		if id != "sha256:shared" {
			t.Fatalf("caller %d got %q", i, id)
		}
	}
}

// TestAFlightOutlivesOneCallerLeaving: the pull goes on while anyone still waits for it.
func TestAFlightOutlivesOneCallerLeaving(t *testing.T) {
	var f pullFlights
	release := make(chan struct{})
	pull := func(ctx context.Context) (*store.Image, error) {
		select {
		case <-release:
			return &store.Image{ID: "sha256:done"}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	leaving, leave := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := f.do(leaving, "ref", pull)
		gone <- err
	}()
	stays := make(chan error, 1)
	waitForWaiters(t, &f, "ref", 1)
	go func() {
		_, err := f.do(context.Background(), "ref", pull)
		stays <- err
	}()
	waitForWaiters(t, &f, "ref", 2)
	leave()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v", err)
	}
	close(release)
	if err := <-stays; err != nil {
		t.Fatalf("the pull was cancelled under a waiting caller: %v", err)
	}
}

// TestAFlightStopsWhenEveryCallerLeft: the last caller to leave cancels the pull and returns once
// it has cleaned up.
func TestAFlightStopsWhenEveryCallerLeft(t *testing.T) {
	var f pullFlights
	var cleanedUp atomic.Bool
	pull := func(ctx context.Context) (*store.Image, error) {
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // a cleanup that takes a while
		cleanedUp.Store(true)
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.do(ctx, "ref", pull)
		done <- err
	}()
	waitForWaiters(t, &f, "ref", 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("do: %v", err)
	}
	if !cleanedUp.Load() {
		t.Fatal("the caller returned before the pull cleaned up")
	}
}

package store

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// lastTxID is the ID of the last bbolt write transaction: each commit adds one.
func lastTxID(t *testing.T, s *Store) int {
	t.Helper()
	tx, err := s.db.Begin(false)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	return tx.ID()
}

// holdWrites takes bbolt's writer lock, as a long commit would: the next commit waits for the
// returned release.
func holdWrites(t *testing.T, s *Store) (release func()) {
	t.Helper()
	tx, err := s.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback() }
}

// awaitCommitter waits until cond holds of the committer's state.
func awaitCommitter(s *Store, cond func(c *committer) bool) {
	c := s.Sandboxes.commits
	for {
		c.mu.Lock()
		ok := cond(c)
		c.mu.Unlock()
		if ok {
			return
		}
		runtime.Gosched()
	}
}

// Transactions that arrive while another is being written go to disk together, in one bbolt
// transaction: ten writes, one alone and nine waiting behind it, cost two commits.
func TestWritesArrivingTogetherShareACommit(t *testing.T) {
	s, path := openTemp(t)
	before := lastTxID(t, s)
	release := holdWrites(t, s)
	errs := make([]error, 10)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = s.Sandboxes.Create(sandbox("sb0", "n0")) })
	// The first has taken its group and waits for the disk.
	awaitCommitter(s, func(c *committer) bool { return c.leading && len(c.queue) == 0 })
	for i := 1; i < 10; i++ {
		wg.Go(func() {
			if i%2 == 0 {
				errs[i] = s.Containers.Create(&Container{ID: fmt.Sprintf("c%d", i), Name: fmt.Sprintf("c%d", i)})
				return
			}
			errs[i] = s.Sandboxes.Create(sandbox(fmt.Sprintf("sb%d", i), fmt.Sprintf("n%d", i)))
		})
	}
	awaitCommitter(s, func(c *committer) bool { return len(c.queue) == 9 })
	release()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if commits := lastTxID(t, s) - before; commits != 2 {
		t.Fatalf("ten writes, nine of them waiting together, took %d commits; want 2", commits)
	}
	s.Close()
	reopened, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	if n, m := len(reopened.Sandboxes.List(nil)), len(reopened.Containers.List(nil)); n != 6 || m != 4 {
		t.Fatalf("on disk: %d sandboxes and %d containers, want 6 and 4", n, m)
	}
}

// A transaction bbolt refuses fails alone: the others of its group are written.
func TestAFailedWriteFailsAlone(t *testing.T) {
	s, _ := openTemp(t)
	release := holdWrites(t, s)
	var good, bad error
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Sandboxes.Create(sandbox("first", "first")) })
	awaitCommitter(s, func(c *committer) bool { return c.leading && len(c.queue) == 0 })
	wg.Go(func() { good = s.Sandboxes.Create(sandbox("good", "good")) })
	wg.Go(func() { bad = s.Sandboxes.Create(sandbox("", "keyless")) }) // bbolt refuses an empty key
	awaitCommitter(s, func(c *committer) bool { return len(c.queue) == 2 })
	release()
	wg.Wait()
	if good != nil {
		t.Fatalf("a good write failed with its group: %v", good)
	}
	if !errors.Is(bad, bolt.ErrKeyRequired) {
		t.Fatalf("a write bbolt refuses: %v, want its error", bad)
	}
	if !s.Sandboxes.Has("good") || s.Sandboxes.Has("") {
		t.Fatal("the mirror does not match what was written")
	}
	if _, ok := s.Sandboxes.Lookup(SandboxNameKey("keyless")); ok {
		t.Fatal("the failed write holds its name")
	}
	// The failed record's name is free.
	if err := s.Sandboxes.Create(sandbox("again", "keyless")); err != nil {
		t.Fatal(err)
	}
}

// A unique key raced for by many transactions at once goes to exactly one, even while the others
// wait for the disk.
func TestAUniqueKeyRacedForGoesToOne(t *testing.T) {
	s, _ := openTemp(t)
	errs := make([]error, 20)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = s.Sandboxes.Create(sandbox(fmt.Sprintf("sb%d", i), "same")) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrExists):
			t.Fatal(err)
		}
	}
	if won != 1 || len(s.Sandboxes.List(nil)) != 1 {
		t.Fatalf("%d creates won the name, %d records; want 1 and 1", won, len(s.Sandboxes.List(nil)))
	}
}

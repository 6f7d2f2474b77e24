package main

import (
	"fmt"
	"io"
	"log"
	"os"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/cocoonstack/cocoon-cri/test/harness"
)

// runner is what the harness asks of a test (testproc.TB), for a program: it logs, remembers
// whether anything failed, and runs the cleanups the harness registers, last first, when the
// program's work ends, whether it returned or failed.
type runner struct {
	log *log.Logger

	mu       sync.Mutex
	failed   bool
	cleanups []func()
}

// failNow ends the work at once from Fatal, as testing's FailNow does; run recovers it.
type failNow struct{}

func newRunner(w io.Writer) *runner {
	return &runner{log: log.New(w, "", log.LstdFlags|log.Lmicroseconds)}
}

// run runs work on this goroutine, then the cleanups, and returns the exit code: 1 if anything
// failed, on the way or in a cleanup. The harness calls Fatal only from the goroutine it was
// called on, as testing requires of FailNow.
func (r *runner) run(work func()) int {
	r.guard("", work)
	r.runCleanups()
	if r.Failed() {
		return 1
	}
	return 0
}

func (r *runner) runCleanups() {
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for _, fn := range slices.Backward(cleanups) {
		r.guard(" in a cleanup", fn)
	}
}

// guard runs fn; a Fatal in it ends only fn, and any other panic is a failure of the run.
func (r *runner) guard(where string, fn func()) {
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(failNow); !ok {
				r.Errorf("panic%s: %v\n%s", where, p, debug.Stack())
			}
		}
	}()
	fn()
}

func (r *runner) Helper() {}

func (r *runner) Cleanup(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, fn)
}

func (r *runner) Logf(format string, args ...any) {
	_ = r.log.Output(2, fmt.Sprintf(format, args...))
}

func (r *runner) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	_ = r.log.Output(2, "error: "+fmt.Sprintf(format, args...))
}

func (r *runner) Fatal(args ...any) {
	r.Errorf("%s", fmt.Sprint(args...))
	panic(failNow{})
}

func (r *runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(failNow{})
}

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// TempDir is a new directory, removed with the cleanups, or by the next SweepStale if the program
// is killed.
func (r *runner) TempDir() string {
	dir, err := harness.MkdirOwned("", "-cluster-run")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			r.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

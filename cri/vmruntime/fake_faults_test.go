package vmruntime

import (
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// faults records the calls a fake gets, in order, and makes named calls fail: once, or until
// healed. Calls are recorded as "Method arg ...", with the arguments that tell one call from
// another (a VM's name or ID, a snapshot's name, a sandbox ID). Only calls that can fail are
// recorded: a fake's pure answers (paths, the binary's name) are not calls to anything.
type faults struct {
	mu    sync.Mutex
	log   []string
	fails map[string][]injected
}

type injected struct {
	err    error
	always bool
}

// failOnce makes the next call of method fail with err. Several queue up, in order.
func (f *faults) failOnce(method string, err error) { f.inject(method, injected{err: err}) }

// failAlways makes every call of method fail with err until heal.
func (f *faults) failAlways(method string, err error) {
	f.inject(method, injected{err: err, always: true})
}

func (f *faults) inject(method string, in injected) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails == nil {
		f.fails = map[string][]injected{}
	}
	f.fails[method] = append(f.fails[method], in)
}

// heal removes every failure injected for method.
func (f *faults) heal(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.fails, method)
}

// call records a call and returns the failure injected for it, if any.
func (f *faults) call(method string, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, strings.Join(append([]string{method}, args...), " "))
	queue := f.fails[method]
	if len(queue) == 0 {
		return nil
	}
	if !queue[0].always {
		f.fails[method] = queue[1:]
	}
	return queue[0].err
}

// calls returns the calls recorded so far of the given methods (of every method for none), in
// order.
func (f *faults) calls(methods ...string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.log {
		method, _, _ := strings.Cut(c, " ")
		if len(methods) == 0 || slices.Contains(methods, method) {
			out = append(out, c)
		}
	}
	return out
}

// reset forgets the calls recorded so far (not the injected failures).
func (f *faults) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = nil
}

// cocoonErr is a failure as pkg/cocoon reports one: cocoon's message, the kind it classifies as
// (nil for none), the command line.
func cocoonErr(kind error, message string, args ...string) error {
	return &cocoon.CommandError{Args: args, ExitCode: 1, Message: message, Kind: kind, Err: errors.New("exit status 1")}
}

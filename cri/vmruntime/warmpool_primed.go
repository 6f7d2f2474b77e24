package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// primedPerPool is how many of a pool's VMs, the next in line for a hand-over, hold a primed
// shell. Each is a cocoon vm exec process on the node for as long as it waits.
const primedPerPool = 2

// primedCommand reads its script to the end of its input, then runs it with no input, so that
// nothing in the script can read past it.
var primedCommand = []string{"/bin/sh", "-c", `script=$(cat) && exec /bin/sh -c "$script" </dev/null`}

// errShellEnded is what a write to a primed shell that no longer runs gets.
var errShellEnded = errors.New("the primed shell has ended")

// primedShell is a shell held open in a ready pool VM's guest through cocoon's vm exec, waiting on
// its input for the hand-over's set-up script. The hand-over then waits for the script alone, not
// for a cocoon command to start, find the VM and reach its agent.
type primedShell struct {
	input  *io.PipeWriter
	output *syncio.Tail
	cancel context.CancelFunc
	done   chan struct{}
	code   int // once done
	err    error
}

// primeShell starts a primed shell in pool VM vmID; it lasts until it runs a script, or close, or
// ctx ends.
func (s *Runtime) primeShell(ctx context.Context, vmID string) *primedShell {
	ctx, cancel := context.WithCancel(ctx)
	r, w := io.Pipe()
	ps := &primedShell{input: w, output: &syncio.Tail{Max: guestOutputTail}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ps.done)
		ps.code, ps.err = s.cocoon.VMExec(ctx, vmID, primedCommand, cocoon.ExecOptions{Stdin: r, Stdout: ps.output, Stderr: ps.output})
		r.CloseWithError(errShellEnded)
	}()
	return ps
}

// run gives the shell its script and waits, within ctx, for the script's exit code. An error says
// that the script may not have run: the shell had ended, or cocoon failed.
func (ps *primedShell) run(ctx context.Context, script string) (int, string, error) {
	written := make(chan error, 1)
	go func() {
		_, err := io.WriteString(ps.input, script)
		written <- errors.Join(err, ps.input.Close())
	}()
	select {
	case <-ps.done:
	case <-ctx.Done():
		ps.close()
		return -1, "", fmt.Errorf("the primed shell did not answer in time: %w", ctx.Err())
	}
	if err := errors.Join(<-written, ps.err); err != nil {
		return -1, "", err
	}
	return ps.code, strings.TrimSpace(ps.output.String()), nil
}

// close ends the shell without a script and waits for its cocoon process to go.
func (ps *primedShell) close() {
	ps.cancel()
	_ = ps.input.CloseWithError(errShellEnded)
	<-ps.done
}

// primePools gives the next primedPerPool VMs of each pool a primed shell, and ends those of VMs
// that left the pools' lines.
func (s *Runtime) primePools(ctx context.Context) {
	p := s.pools
	p.mu.Lock()
	next := map[string]bool{}
	for _, wp := range p.pools {
		for _, name := range wp.ready[:min(primedPerPool, len(wp.ready))] {
			next[name] = true
		}
	}
	var stale []*primedShell
	for name, ps := range p.primed {
		if !next[name] {
			stale = append(stale, ps)
			delete(p.primed, name)
		}
	}
	var prime []string
	for name := range next {
		if p.primed[name] == nil {
			prime = append(prime, name)
		}
	}
	p.mu.Unlock()
	for _, ps := range stale {
		ps.close()
	}
	for _, name := range prime {
		pv, err := s.store.PoolVMs.Get(name)
		if err != nil {
			continue
		}
		ps := s.primeShell(ctx, pv.Spec.ID)
		p.mu.Lock()
		if p.primed[name] == nil && p.isReady(name) {
			p.primed[name] = ps
			ps = nil
		}
		p.mu.Unlock()
		if ps != nil {
			ps.close() // claimed meanwhile
		}
	}
}

// isReady says whether a pool has VM name ready; p.mu is held.
func (p *warmPools) isReady(name string) bool {
	for _, wp := range p.pools {
		if slices.Contains(wp.ready, name) {
			return true
		}
	}
	return false
}

// takePrimed takes the primed shell of pool VM name, if it has one; p.mu is held.
func (p *warmPools) takePrimed(name string) *primedShell {
	ps := p.primed[name]
	delete(p.primed, name)
	return ps
}

// closePrimed ends the primed shell of pool VM name, if it has one.
func (p *warmPools) closePrimed(name string) {
	p.mu.Lock()
	ps := p.takePrimed(name)
	p.mu.Unlock()
	if ps != nil {
		ps.close()
	}
}

// configurePoolGuest gives a handed-over pool VM's guest the pod's identity: through its primed
// shell where it has one that takes the script, otherwise through a vm exec of its own.
func (s *Runtime) configurePoolGuest(ctx context.Context, sb *store.Sandbox, c *store.Container, ps *primedShell) error {
	if ps != nil {
		code, out, err := ps.run(ctx, guestSetupScript(sb, c, s.nowFunc()))
		switch {
		case err == nil && code == 0:
			return nil
		case err == nil:
			return fmt.Errorf("configuring the guest for the pod failed with exit code %d: %s", code, out)
		case ctx.Err() != nil:
			return err
		}
		s.log.Debug("the pool VM's primed shell did not take the set-up; running it through a vm exec of its own", "vm", c.VM.Name, "err", err)
	}
	return s.configureGuest(ctx, sb, c)
}

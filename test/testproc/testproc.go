// Package testproc runs the daemons the tests start (cocoon-cri, containerd, the kubelet, the
// registry) and stops them by PID: SIGTERM, then SIGKILL once a grace period has passed, so that
// nothing a test started outlives it, also when it fails.
package testproc

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// Process is a started command whose end is awaited in the background.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts cmd.
func Start(cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited (nil: status 0); only once Done is closed.
func (p *Process) Err() error { return p.err }

// Exited reports whether the process exits within the given time.
func (p *Process) Exited(within time.Duration) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	select {
	case <-p.done:
		return true
	case <-time.After(within):
		return false
	}
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then kills it. clean reports
// whether it exited by itself; err is how it exited.
func (p *Process) Stop(grace time.Duration) (clean bool, err error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.Exited(grace) {
		return true, p.err
	}
	p.Kill()
	return false, p.err
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// WaitReady calls ready every interval until it succeeds. It fails when the process exits first,
// or with ready's last error once timeout has passed.
func (p *Process) WaitReady(timeout, interval time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.Exited(interval) {
			return fmt.Errorf("exited (%v) before it was ready", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %s: %w", timeout, err)
		}
	}
}

// Running says whether pid runs: it exists and has not exited (a zombie has, and only waits to be
// reaped). The one liveness check of the tests, as of the daemon (vmstats.Running).
func Running(pid int) bool { return vmstats.Running("/proc", pid) }

// State is pid's state letter in /proc (R, S, Z ...), "" once it is gone.
func State(pid int) string {
	st, err := vmstats.ReadStat("/proc", pid)
	if err != nil {
		return ""
	}
	return string(st.State)
}

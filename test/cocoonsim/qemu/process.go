package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// controlPoll is how often Run retries QEMU's control socket while QEMU sets up.
const controlPoll = 20 * time.Millisecond

// Process is a running VM.
type Process struct {
	cmd     *exec.Cmd
	qmpSock string
	stderr  *syncio.Tail
	done    chan struct{}
	err     error // how QEMU ended; set before done is closed
}

// PID is QEMU's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once QEMU has exited and its socket directory is gone.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for QEMU to exit. It returns nil when QEMU ended cleanly (the guest powered off, or
// QEMU was told to quit with SIGTERM) and otherwise an error with QEMU's last words.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// PowerOff presses the VM's ACPI power button (QMP system_powerdown) and waits for the guest to
// power off, until ctx ends. A guest that ignores the button keeps running: the caller decides
// when to Kill.
func (p *Process) PowerOff(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	if err := qmpExecute(ctx, p.qmpSock, "system_powerdown"); err != nil {
		select {
		case <-p.done: // QEMU went away while we talked to it; that is what we asked for
			return p.err
		default:
			return fmt.Errorf("qemu: power off: %w", err)
		}
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("qemu: guest did not power off: %w", ctx.Err())
	}
}

// Kill ends QEMU at once (SIGKILL) and waits for it to be gone.
func (p *Process) Kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("qemu: kill %d: %w", p.PID(), err)
	}
	<-p.done
	return nil
}

// wait reaps QEMU and removes its socket directory, whatever ended it.
func (p *Process) wait(dir string) {
	err := p.cmd.Wait()
	if rmErr := os.RemoveAll(dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("remove %s: %w", dir, rmErr))
	}
	if err != nil {
		err = fmt.Errorf("qemu exited: %w%s", err, p.stderrSuffix())
	}
	p.err = err
	close(p.done)
}

// awaitControl waits until QEMU answers on its QMP socket: it has parsed its command line, opened
// the TAPs and built the machine. A QEMU that exits first reports why.
func (p *Process) awaitControl(ctx context.Context) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		err := qmpExecute(attempt, p.qmpSock)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			if p.err == nil {
				return errors.New("qemu: start: qemu exited")
			}
			return fmt.Errorf("qemu: start: %w", p.err)
		case <-ctx.Done():
			return fmt.Errorf("qemu: start: no answer on %s: %w (last: %v)", p.qmpSock, ctx.Err(), err)
		case <-time.After(controlPoll):
		}
	}
}

// stderrSuffix is ": <stderr>" for an error message, or nothing when QEMU said nothing.
func (p *Process) stderrSuffix() string {
	s := strings.TrimSpace(p.stderr.String())
	if s == "" {
		return ""
	}
	return ": " + s
}

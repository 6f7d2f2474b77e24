package guest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// reaper is the guest OS's init duty. The guest OS process is PID 1 of the guest's PID
// namespace, so every process orphaned inside the guest becomes its child and must be reaped,
// and everything left in the guest dies with it. Children are therefore never waited for with
// exec.Cmd.Wait (which would race this loop): start registers them and hands back their status.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan unix.WaitStatus{}}
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	go func() {
		for range sigchld {
			r.reapAll()
		}
	}()
	return r
}

// reapAll collects every child that has exited; signals coalesce, so one SIGCHLD may stand for
// several.
func (r *reaper) reapAll() {
	for {
		var status unix.WaitStatus
		pid, err := unix.Wait4(-1, &status, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		waiter := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if waiter != nil {
			waiter <- status
		}
	}
}

// start starts cmd, whose standard streams must be files (or nil) so that nothing but this
// reaper ever waits for it, and returns a channel that receives its exit status. The lock held
// across the start makes sure an immediate exit is not reaped before it is registered.
func (r *reaper) start(cmd *exec.Cmd) (<-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan unix.WaitStatus, 1)
	r.waiters[cmd.Process.Pid] = exited
	return exited, nil
}

// exitCode is what cocoon-agent reports for a finished child: its exit status, or -1 when a
// signal killed it (Go's ProcessState.ExitCode), which cocoon vm exec passes on as exit 255.
func exitCode(status unix.WaitStatus) int {
	return status.ExitStatus()
}

func describeExit(status unix.WaitStatus) string {
	if status.Signaled() {
		return fmt.Sprintf("killed by %v", status.Signal())
	}
	return fmt.Sprintf("exit status %d", status.ExitStatus())
}

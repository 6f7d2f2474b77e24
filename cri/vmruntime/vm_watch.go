package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// Reasons a running container's VM ended outside cocoon-cri.
const (
	reasonVMStopped = "VMStopped"
	reasonVMCrashed = "VMCrashed"
)

const (
	// vmWatchPoll is how often cocoon re-checks hypervisor processes for the event stream: a
	// crashed VM is reported within it. Changes to cocoon's records are reported at once.
	vmWatchPoll = time.Second
	// vmSweepInterval paces the check of every running container against cocoon's list, which
	// covers VMs that ended while the event stream was down.
	vmSweepInterval = 10 * time.Second
	watchBackoffMin = time.Second
	watchBackoffMax = time.Minute
)

// vmWatcher turns a running container EXITED when its VM ends outside cocoon-cri: it follows
// cocoon's VM events, and sweeps every running container against cocoon's list, which covers what
// the events missed. It looks under the sandbox's lock, so a stop or removal in flight keeps its
// own exit status; what an ended VM means for its container is the runtime's (recordExit, and
// reclaimLostVM for a VM cocoon lost with the pod interface in it).
type vmWatcher struct {
	log           *slog.Logger
	store         *store.Store
	locks         *keylock.Map
	cocoon        Cocoon
	metrics       interface{ WatcherRestarted() }
	recordExit    func(*store.Container, exitStatus) error
	reclaimLostVM func(*store.Sandbox, *store.Container) error
}

// WatchVMs follows cocoon's VM events until ctx ends, restarting the stream with backoff when it
// stops, and sweeps running containers periodically. A VM that stops, crashes or disappears turns
// its container EXITED.
func (s *Runtime) WatchVMs(ctx context.Context) { s.watcher.watch(ctx) }

// watch is WatchVMs.
func (w *vmWatcher) watch(ctx context.Context) {
	go w.sweepLoop(ctx)
	backoff := watchBackoffMin
	for {
		started := time.Now()
		err := w.cocoon.WatchVMs(ctx, vmWatchPoll, func(ev cocoon.VMEvent) { w.onVMEvent(ctx, ev) })
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > watchBackoffMax {
			backoff = watchBackoffMin
		}
		w.log.Warn("the VM event stream stopped; restarting it", "err", err, "in", backoff)
		if w.metrics != nil {
			w.metrics.WatcherRestarted()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
}

// onVMEvent looks at an event without waiting for any lock: the stream must keep flowing while a
// lifecycle RPC holds a sandbox.
func (w *vmWatcher) onVMEvent(ctx context.Context, ev cocoon.VMEvent) {
	if ev.Event != cocoon.VMDeleted && !vmEnded(ev.VM.State) {
		return
	}
	for _, c := range w.runningContainersOf(ev.VM.ID) {
		go w.checkVMEnded(ctx, c.SandboxID, c.ID, c.VM.ID)
	}
}

func (w *vmWatcher) sweepLoop(ctx context.Context) {
	t := time.NewTicker(vmSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.sweep(ctx)
		}
	}
}

// sweep checks every running container against cocoon's VM list: one cocoon call, whatever the
// number of pods.
func (w *vmWatcher) sweep(ctx context.Context) {
	if len(w.store.Containers.List(awakeRunning)) == 0 {
		return
	}
	vms, err := w.cocoon.VMList(ctx)
	if err != nil {
		w.log.Warn("checking running VMs failed", "err", err)
		return
	}
	w.checkRunning(ctx, vms)
}

// checkRunning records exited the running containers whose VM no longer runs according to vms (a
// vm list). vm list shows a dead hypervisor as running, so its PID is checked here; a suspect is
// confirmed with vm inspect before anything is recorded.
func (w *vmWatcher) checkRunning(ctx context.Context, vms []cocoon.VM) {
	byID := make(map[string]cocoon.VM, len(vms))
	for _, vm := range vms {
		byID[vm.ID] = vm
	}
	// Several at once: each suspect may wait staleSettle for a second look; a few cocoon calls at
	// a time, after a node-wide crash too.
	var g errgroup.Group
	g.SetLimit(checkConcurrency)
	for _, c := range w.store.Containers.List(awakeRunning) {
		vm, ok := byID[c.VM.ID]
		if ok && vm.State == cocoon.VMStateRunning && hypervisorProcess(vm.PID, c.VM).Alive(procRoot) {
			continue
		}
		g.Go(func() error {
			w.checkVMEnded(ctx, c.SandboxID, c.ID, c.VM.ID)
			return nil
		})
	}
	_ = g.Wait()
}

// checkConcurrency bounds the VMs checked at once by a sweep.
const checkConcurrency = 8

// staleSettle is how long a VM whose hypervisor is gone while cocoon's record still says running
// ("stopped (stale)") is given before it counts as crashed: cocoon's own vm stop and vm rm end the
// hypervisor first and write the record after, and a look in between must not call that a crash.
const staleSettle = 3 * time.Second

// checkVMEnded asks cocoon about a running container's VM and, if it is no longer running,
// records the container's end. A stale VM is looked at again after staleSettle.
func (w *vmWatcher) checkVMEnded(ctx context.Context, sandboxID, containerID, vmID string) {
	if !w.checkVMEndedOnce(ctx, sandboxID, containerID, vmID, false) {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(staleSettle):
		w.checkVMEndedOnce(ctx, sandboxID, containerID, vmID, true)
	}
}

// checkVMEndedOnce is one look, under the sandbox lock so a stop or removal in flight is seen
// through (their own exit status stands). It reports a stale VM it left for a second look.
func (w *vmWatcher) checkVMEndedOnce(ctx context.Context, sandboxID, containerID, vmID string, settled bool) (again bool) {
	unlock := w.locks.Lock(sandboxID)
	defer unlock()
	c, err := w.store.Containers.Get(containerID)
	if err != nil || !awakeRunning(c) || c.VM.ID != vmID {
		return false
	}
	sb, err := w.store.Sandboxes.Get(sandboxID)
	if err != nil {
		return false
	}
	vm, err := w.cocoon.VMInspect(ctx, vmID)
	// cocoon's liveness check is kill(pid, 0), which a hypervisor nobody reaped passes: it keeps
	// calling such a VM running (docs/cocoon-contract.md section 7).
	// Nor can it tell its hypervisor from a later process given the same PID.
	deadButRunning := err == nil && vm.State == cocoon.VMStateRunning && !hypervisorProcess(vm.PID, c.VM).Alive(procRoot)
	var st exitStatus
	switch {
	case deadButRunning && !settled:
		return true
	case deadButRunning:
		why := "nothing reaped it"
		if vmstats.Running(procRoot, vm.PID) {
			why = "its PID now belongs to another process"
		}
		st = exitStatus{killedExitCode, reasonVMCrashed, fmt.Sprintf("the hypervisor process (PID %d) ended unexpectedly; cocoon still reports it running because %s", vm.PID, why)}
	case errors.Is(err, cocoon.ErrNotFound):
		st = exitStatus{killedExitCode, reasonVMGone, "the VM was removed from cocoon outside cocoon-cri"}
	case err != nil:
		w.log.Warn("inspecting a VM that may have ended failed", "container", c.ID, "vm", vmID, "err", err)
		return false
	case vm.State == cocoon.VMStateStopped:
		st = exitStatus{0, reasonVMStopped, "the VM stopped outside cocoon-cri (its guest powered off, or cocoon vm stop)"}
	case vm.State == cocoon.VMStateStale && !settled:
		return true
	case vmEnded(vm.State):
		st = exitStatus{killedExitCode, reasonVMCrashed, fmt.Sprintf("the hypervisor process ended unexpectedly (cocoon reports %q)", vm.State)}
	default:
		return false
	}
	// An ended VM keeps the pod interface for the kubelet's next container to take, as a stopped
	// one does, unless cocoon lost it.
	if errors.Is(err, cocoon.ErrNotFound) {
		if err := w.reclaimLostVM(sb, c); err != nil {
			w.log.Warn("taking the pod interface back from a VM cocoon lost failed", "container", c.ID, "err", err)
		}
	}
	if err := w.recordExit(c, st); err != nil {
		w.log.Error("recording the end of a VM failed", "container", c.ID, "err", err)
		return false
	}
	w.log.Warn("container exited: its VM ended outside cocoon-cri", "container", c.ID, "vm", vmID, "reason", st.reason)
	return false
}

// awakeRunning selects the running containers whose VM should run: a hibernated VM, and one
// hibernating, are stopped on purpose.
func awakeRunning(c *store.Container) bool {
	return c.State == store.ContainerRunning && c.VM.Hibernation.Snapshot == ""
}

// vmEnded reports whether a VM in this state no longer runs its guest.
func vmEnded(st cocoon.VMState) bool {
	return st == cocoon.VMStateStopped || st == cocoon.VMStateStale || st == cocoon.VMStateError
}

func (w *vmWatcher) runningContainersOf(vmID string) []*store.Container {
	return w.store.Containers.List(func(c *store.Container) bool {
		return awakeRunning(c) && c.VM.ID == vmID
	})
}

// hypervisorProcess is the identity of the VM's hypervisor, which cocoon reports at pid. While that
// is the PID the container's start recorded, it must be that very process, told by its start time:
// a PID is reused once its process is gone, and cocoon's own check (kill(pid, 0)) cannot tell. A
// hypervisor cocoon started anew has another PID, and no recorded start.
func hypervisorProcess(pid int, rec store.VM) vmstats.ProcessIdentity {
	p := vmstats.ProcessIdentity{PID: pid}
	if pid == rec.PID {
		p.Start = rec.PIDStart
	}
	return p
}

// vmGonePoll paces the look for a hypervisor's end where the kernel cannot tell it (no pidfd), and
// how often a wait on a pidfd looks at its context.
const vmGonePoll = 50 * time.Millisecond

// waitVMGone waits, within ctx, until the VM's hypervisor process has ended (a zombie has). The
// kernel marks a pidfd readable the moment its process exits, so a guest's power-off is seen at
// once rather than at the next look. The time is the guest's, not cocoon-cri's (pkg/waittime).
func waitVMGone(ctx context.Context, p vmstats.ProcessIdentity) error {
	defer waittime.Begin(ctx)()
	if !p.Alive(procRoot) {
		return nil
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return pollVMGone(ctx, p)
	}
	defer unix.Close(fd) //nolint:errcheck
	// Checked again now that the pidfd holds the process: the PID may have been reused before the
	// open, and then the pidfd names another process.
	if !p.Alive(procRoot) {
		return nil
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(vmGonePoll/time.Millisecond))
		switch {
		case n > 0:
			return nil
		case err != nil && !errors.Is(err, unix.EINTR):
			return pollVMGone(ctx, p)
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
}

// pollVMGone is waitVMGone by looking at /proc every vmGonePoll.
func pollVMGone(ctx context.Context, p vmstats.ProcessIdentity) error {
	for p.Alive(procRoot) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(vmGonePoll):
		}
	}
	return nil
}

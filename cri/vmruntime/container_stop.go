package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// Exit status of a stopped VM. A guest that powered off within the timeout completed; one cocoon
// had to stop forcibly (timeout 0, or a guest that ignored the power button until the timeout)
// reads like a SIGKILLed process.
const (
	killedExitCode  = 137
	reasonCompleted = "Completed"
	reasonError     = "Error"
	reasonVMGone    = "VMGone"
)

// StopContainer powers the VM off, giving the guest timeout seconds before cocoon forces it.
// Stopping a missing, created or exited container succeeds.
func (s *Runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if req.GetTimeout() < 0 {
		return nil, invalid("timeout must not be negative, got %d", req.GetTimeout())
	}
	c, sb, unlock, err := s.lockContainer(req.GetContainerId())
	if err != nil {
		if isNotFound(err) {
			return &runtimeapi.StopContainerResponse{}, nil
		}
		return nil, err
	}
	defer unlock()
	if c.State != store.ContainerRunning {
		return &runtimeapi.StopContainerResponse{}, nil
	}
	if err := s.stopVM(ctx, sb, c, time.Duration(req.GetTimeout())*time.Second); err != nil {
		return nil, err
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

// mainExitStopTimeout is the power-off budget for a VM whose command finished.
const mainExitStopTimeout = 10 * time.Second

// stopVM stops a running container's VM and records it EXITED with the status the stop implies.
// A guest cocoon would stop at once (cocoon.StopsAtOnce) is first asked to power off through
// the exec path, within timeout. The caller holds the sandbox lock.
func (s *Runtime) stopVM(ctx context.Context, sb *store.Sandbox, c *store.Container, timeout time.Duration) error {
	if c.VM.Hibernated() {
		// Waking the guest to shut it down would take longer than the stop is meant to: its saved
		// state is discarded instead, as a SIGKILL discards a process's.
		if err := s.discardHibernation(ctx, c); err != nil {
			return err
		}
		s.log.Info("container stopped while its VM hibernated", "container", c.ID, "vm", c.VM.ID)
		return s.recordExit(c, exitStatus{killedExitCode, reasonError, "stopped while hibernated: the guest was not woken, its saved state was discarded"})
	}
	start := s.nowFunc()
	var asked powerOffAnswer
	stopsAtOnce := cocoon.StopsAtOnce(c.VM.Backend, c.VM.DirectBoot)
	if stopsAtOnce && timeout > 0 {
		asked = s.askGuestPowerOff(ctx, sb, c, timeout)
	}
	err := s.powerOff(ctx, sb, c, timeout)
	took := s.nowFunc().Sub(start)
	status := exitStatus{reason: reasonCompleted, message: "VM powered off"}
	switch {
	case errors.Is(err, cocoon.ErrNotFound):
		status = exitStatus{killedExitCode, reasonVMGone, "the VM no longer exists in cocoon"}
	case err != nil:
		return err
	case timeout == 0:
		status = exitStatus{killedExitCode, reasonError, "VM stopped forcibly (timeout 0)"}
	case stopsAtOnce && asked.poweredOff:
		status.message = "the guest powered off when asked through exec"
	case stopsAtOnce:
		status = exitStatus{killedExitCode, reasonError, fmt.Sprintf("the guest did not power off when asked through exec within %s (%s); "+
			"cocoon stopped the VM forcibly, as it stops every direct-boot cloud-hypervisor VM", timeout, asked.why)}
	case took >= timeout:
		status = exitStatus{killedExitCode, reasonError, fmt.Sprintf("the guest did not power off within %s; cocoon stopped the VM forcibly", timeout)}
	}
	s.log.Info("container stopped", "container", c.ID, "vm", c.VM.ID, "exitCode", status.code, "reason", status.reason, "took", took)
	return s.recordExit(c, status)
}

// powerOffAnswer is how a guest took a request to power off.
type powerOffAnswer struct {
	poweredOff bool
	why        string // when it did not
}

// askGuestPowerOff runs poweroff in the guest and waits, within timeout, for its hypervisor to
// end. The command's own result says little: a guest that goes down may cut the session first.
func (s *Runtime) askGuestPowerOff(ctx context.Context, sb *store.Sandbox, c *store.Container, timeout time.Duration) powerOffAnswer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch path, err := s.guest.path(ctx); {
	case err != nil:
		return powerOffAnswer{why: err.Error()}
	case path == ExecPathNone:
		return powerOffAnswer{why: "no way to run commands in guests"}
	}
	code, err := s.guest.run(ctx, sb, c, powerOffCommand(), streaming.ExecIO{Stdout: io.Discard, Stderr: io.Discard})
	switch {
	case err == nil && code != 0:
		return powerOffAnswer{why: fmt.Sprintf("poweroff exited %d", code)}
	case errdefs.IsFailedPrecondition(err):
		return powerOffAnswer{why: err.Error()}
	}
	if waitVMGone(ctx, hypervisorProcess(c.VM.PID, c.VM)) != nil {
		if err != nil {
			return powerOffAnswer{why: err.Error()}
		}
		return powerOffAnswer{why: "it was still running at the deadline"}
	}
	return powerOffAnswer{poweredOff: true}
}

// powerOff stops the VM. The pod interface stays in the stopped VM's namespace: moving it costs
// tens of milliseconds of the kernel's RCU grace periods, and it is moved only when something
// needs it (docs/networking.md). A VM cocoon no longer has is reported as ErrNotFound (wrapped).
func (s *Runtime) powerOff(ctx context.Context, sb *store.Sandbox, c *store.Container, timeout time.Duration) error {
	err := s.cocoonFor(sb).VMStop(ctx, c.VM.ID, cocoon.StopOptions{Force: timeout == 0, Timeout: timeout})
	switch {
	case errors.Is(err, cocoon.ErrNotFound):
		if rerr := s.reclaimLostVM(sb, c); rerr != nil {
			return rerr
		}
		return err
	case err != nil:
		return fmt.Errorf("stop VM %s: %w", c.VM.ID, err)
	}
	return nil
}

// exitStatus is how a container ended.
type exitStatus struct {
	code    int32
	reason  string
	message string
}

// recordExit records the container EXITED and closes its streams. It comes last, so a failure
// before it is retried by the kubelet's next stop.
func (s *Runtime) recordExit(c *store.Container, st exitStatus) error {
	exited, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.State, r.FinishedAt = store.ContainerExited, s.now()
		r.ExitCode, r.Reason, r.Message = st.code, st.reason, st.message
		r.VM.PID = 0
		return nil
	})
	if err != nil {
		return fmt.Errorf("record container exited: %w", err)
	}
	s.emit(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, exited)
	s.idle.drop(c.ID)
	s.stopIO(c.ID)
	s.stats.forget(c.ID)
	s.releaseCgroup(exited)
	if err := s.shares.release(exited); err != nil {
		s.log.Warn("the volumes' share of an exited VM is left on the node; removing the container retries", "container", c.ID, "err", err)
	}
	return nil
}

package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// Exit status of a container whose VM could not be started, as containerd reports it.
const (
	startErrorExitCode = 128
	reasonStartError   = "StartError"
)

// StartContainer makes and boots the container's VM: vm clone for a snapshot image, vm create and
// vm start for a VM image. A sandbox runs at most one VM at a time.
func (s *Runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	c, sb, unlock, err := s.lockContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c.State != store.ContainerCreated {
		return nil, precondition("container %s is %s; only a created container can be started (the kubelet creates a new container to restart one)", c.ID, c.State)
	}
	if sb.State != store.SandboxReady {
		return nil, precondition("pod sandbox %s is not ready (stopped); its containers cannot start", sb.ID)
	}
	for _, other := range s.sandboxContainers(sb.ID) {
		if other.State == store.ContainerRunning {
			return nil, precondition("pod sandbox %s already runs container %s (VM %s): a cocoon pod runs one VM at a time; stop that container first",
				sb.ID, other.ID, other.VM.Name)
		}
	}

	s.pools.starts.Add(1)
	defer s.pools.starts.Add(-1)
	l, pv, place, pooled := s.takePoolVM(ctx, sb, c)
	cgroup, cgroupCreated := place.cgroup, place.created
	if pooled {
		c.VM.Name, c.VM.ID, c.VM.Pooled = pv.Name, l.ID, true
	} else {
		var vm *cocoon.VM
		if vm, err = s.launchVM(ctx, sb, c); err == nil {
			l = launchedFrom(vm)
			cgroup, cgroupCreated, err = s.placeVM(sb, c, l.PID)
		}
	}
	log := s.log.With("container", c.ID, "sandbox", sb.ID, "vm", c.VM.Name)
	if err == nil {
		err = s.attachDevices(ctx, sb, c, l.ID)
	}
	if err == nil {
		// The VM runs either way; only the kernel's choice under memory pressure is at stake.
		if oomErr := s.setOOMScoreAdj(c, l.PID); oomErr != nil {
			log.Warn("the VM keeps the OOM score cocoon gave it", "err", oomErr)
		}
	}
	if err != nil {
		log.Error("VM did not start", "err", err)
		s.cleanUpFailedStart(sb, c)
		if cgErr := s.removeCgroup(context.WithoutCancel(ctx), sb, c, cgroupCreated, cgroupRemoveWait); cgErr != nil {
			log.Warn("the cgroup of a failed start is left behind", "err", cgErr)
		}
		if pooled && pv.Spec.Cgroup != "" {
			if cgErr := s.dropCgroup(context.WithoutCancel(ctx), pv.Spec.Cgroup, pv.Spec.CgroupCreated, cgroupRemoveWait); cgErr != nil {
				log.Warn("the pool cgroup of a failed start is left behind", "err", cgErr)
			}
		}
		exited, recErr := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
			r.State, r.FinishedAt = store.ContainerExited, s.now()
			r.ExitCode, r.Reason, r.Message = startErrorExitCode, reasonStartError, err.Error()
			r.VM.ID, r.VM.PID = "", 0
			return nil
		})
		if recErr != nil {
			log.Error("recording the failed start failed", "err", recErr)
		} else {
			s.emit(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, exited)
		}
		return nil, fmt.Errorf("start VM %s: %w", c.VM.Name, err)
	}
	running, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error {
		r.State, r.StartedAt = store.ContainerRunning, s.now()
		l.record(&r.VM)
		r.VM.Cgroup, r.VM.CgroupCreated = cgroup, cgroupCreated
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record container running: %w", err)
	}
	s.emit(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, running)
	s.startIO(sb, running)
	log.Info("container started", "vmID", l.ID, "pid", l.PID, "pooled", pooled)
	return &runtimeapi.StartContainerResponse{}, nil
}

// launchVM makes the VM. A VM already holding the container's name is the leftover of a start
// that was cut short (the container is still CREATED): it is removed and the start made again.
func (s *Runtime) launchVM(ctx context.Context, sb *store.Sandbox, c *store.Container) (*cocoon.VM, error) {
	cc := s.cocoonFor(sb)
	vm, err := s.makeVM(ctx, cc, c)
	if errors.Is(err, cocoon.ErrAlreadyExists) {
		s.log.Warn("removing a VM left by an interrupted start", "container", c.ID, "vm", c.VM.Name)
		if rmErr := cc.VMRemove(ctx, c.VM.Name, true); rmErr != nil && !errors.Is(rmErr, cocoon.ErrNotFound) {
			return nil, fmt.Errorf("remove leftover VM %s: %w", c.VM.Name, rmErr)
		}
		vm, err = s.makeVM(ctx, cc, c)
	}
	return vm, err
}

// makeVM makes the VM on the sandbox's network: one NIC on tapmanager.CocoonNetwork, whose attach
// plugin hands the pod interface to cocoon.
func (s *Runtime) makeVM(ctx context.Context, cc Cocoon, c *store.Container) (*cocoon.VM, error) {
	spec := c.VM
	if spec.FromDir {
		// The directory is its owner's, who may have removed it since the restore.
		if _, err := os.Stat(filepath.Join(spec.Source, snapshotEnvelopeFile)); err != nil {
			return nil, precondition("the pod checkpoint's snapshot directory %s, which this container restores, is gone or unreadable (%v): "+
				"keep a checkpoint until the containers restored from it have started", spec.Source, err)
		}
	}
	if spec.Mode == store.VMClone {
		opts := cloneOptions(spec)
		if spec.ForkOf != "" {
			save, release, err := s.saveForkSource(ctx, spec.ForkOf)
			if err != nil {
				return nil, err
			}
			defer release()
			if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error { r.VM.Source = save.snapshot; return nil }); err != nil {
				return nil, fmt.Errorf("record the fork's save: %w", err)
			}
			spec.Source, opts.CopyMemory = save.snapshot, true
		}
		return cc.VMClone(ctx, spec.Source, opts)
	}
	created, err := cc.VMCreate(ctx, spec.Source, cocoon.CreateOptions{
		Name: spec.Name, CPU: spec.CPU, Memory: spec.Memory, Storage: spec.Storage,
		NICs: spec.NICs, Network: tapmanager.CocoonNetwork,
		NoDirectIO: spec.NoDirectIO, Windows: spec.Windows, Firecracker: spec.Backend == cocoon.HypervisorFirecracker,
		SharedMemory: s.shares.wantsSharedMemory(ctx, c),
	})
	if err != nil {
		return nil, err
	}
	// Recorded before the start, so a crash between the two leaves a VM cocoon-cri can name.
	if _, err := s.store.Containers.Modify(c.ID, func(r *store.Container) error { r.VM.ID = created.ID; return nil }); err != nil {
		return nil, fmt.Errorf("record VM %s: %w", created.ID, err)
	}
	if err := cc.VMStart(ctx, created.ID); err != nil {
		return nil, err
	}
	return cc.VMInspect(ctx, created.ID)
}

// cloneOptions are the flags of a clone of spec, a container's VM or a warm pool's, on the
// sandbox's network (tapmanager.CocoonNetwork, whose attach plugin hands the pod interface over).
func cloneOptions(spec store.VM) cocoon.CloneOptions {
	opts := cocoon.CloneOptions{
		Name: spec.Name, Storage: spec.Storage, NICs: spec.NICs, Network: tapmanager.CocoonNetwork,
		NoDirectIO: spec.NoDirectIO, OnDemand: spec.OnDemand, Pull: spec.PullBase, FromDir: spec.FromDir,
		CPU: spec.CPU, Memory: spec.Memory,
	}
	if spec.Backend == cocoon.HypervisorFirecracker {
		// cocoon refuses any size on a Firecracker clone, even the snapshot's own.
		opts.CPU, opts.Memory, opts.Storage = 0, 0, 0
	}
	return opts
}

// launched is what StartContainer records of a VM that runs.
type launched struct {
	ID, NetNS, APISocket, COWPath string
	PID                           int
	// PIDStart is unknown (0) if the hypervisor already exited: the watcher records that.
	PIDStart     uint64
	SharedMemory bool
}

func launchedFrom(vm *cocoon.VM) launched {
	pidStart, _ := vmstats.StartTicks(procRoot, vm.PID)
	return launched{ID: vm.ID, PID: vm.PID, PIDStart: pidStart, NetNS: vmNetNS(vm), APISocket: vm.SocketPath,
		COWPath: vmCOWPath(vm), SharedMemory: vm.Config.SharedMemory}
}

// launchedOf is the VM a record names.
func launchedOf(v store.VM) launched {
	return launched{ID: v.ID, PID: v.PID, PIDStart: v.PIDStart, NetNS: v.NetNS, APISocket: v.APISocket,
		COWPath: v.COWPath, SharedMemory: v.SharedMemory}
}

// record writes the VM into a container's (or a pool VM's) record.
func (l launched) record(v *store.VM) {
	v.ID, v.PID, v.PIDStart, v.NetNS, v.APISocket = l.ID, l.PID, l.PIDStart, l.NetNS, l.APISocket
	v.COWPath, v.SharedMemory = l.COWPath, l.SharedMemory
}

// leavePoolCgroup settles a handed-over VM's cgroup: the pool's goes once the VM is in the pod's;
// a pod that names no cgroup parent keeps it, as the container's.
func (s *Runtime) leavePoolCgroup(ctx context.Context, pv *store.PoolVM, cgroup, created string) (string, string) {
	if cgroup == "" {
		return pv.Spec.Cgroup, pv.Spec.CgroupCreated
	}
	if pv.Spec.Cgroup != "" {
		if err := s.dropCgroup(context.WithoutCancel(ctx), pv.Spec.Cgroup, pv.Spec.CgroupCreated, cgroupRemoveWait); err != nil {
			s.log.Warn("the pool cgroup of a handed-over VM is left behind", "vm", pv.Name, "err", err)
		}
	}
	return cgroup, created
}

// vmCOWPath is the VM's writable disk as cocoon reports it.
func vmCOWPath(vm *cocoon.VM) string {
	for _, sc := range vm.StorageConfigs {
		if sc != nil && sc.Role == cocoon.StorageRoleCOW {
			return sc.Path
		}
	}
	return ""
}

// vmNetNS is the namespace cocoon made for the VM's NIC.
func vmNetNS(vm *cocoon.VM) string {
	if len(vm.NetworkConfigs) == 0 || vm.NetworkConfigs[0] == nil {
		return ""
	}
	return vm.NetworkConfigs[0].NetnsPath
}

// cleanUpFailedStart removes whatever VM the failed start left (cocoon keeps a VM whose start
// failed, in state error); its removal hands the pod interface back. It has its own deadline: the
// RPC's may be what ran out.
func (s *Runtime) cleanUpFailedStart(sb *store.Sandbox, c *store.Container) {
	ctx, cancel := context.WithTimeout(context.Background(), cocoon.DefaultTimeout)
	defer cancel()
	if err := s.cocoonFor(sb).VMRemove(ctx, c.VM.Name, true); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		s.log.Error("could not remove the VM of a failed start", "container", c.ID, "vm", c.VM.Name, "err", err)
	}
}

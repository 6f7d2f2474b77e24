package vmruntime

import (
	"context"
	"fmt"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// cgroupRemoveWait is how long a cgroup may stay busy with exiting processes (the hypervisor's
// children being reaped) before its removal is left to the next try.
const cgroupRemoveWait = 10 * time.Second

// procRoot is where processes are read.
const procRoot = "/proc"

// vmCgroup is the cgroup a container's VM joins, where containerd puts a container with the same
// cgroup driver (<cgroup_parent>/<container ID> with cgroupfs, a scope in the pod's slice with
// systemd), so the kubelet's cAdvisor finds the VM's usage under the container's ID and the pod
// cgroup above it holds the VM. Empty when the pod names no parent: the VM stays where cocoon
// started it.
func (s *Runtime) vmCgroup(sb *store.Sandbox, containerID string) (string, error) {
	parent := sb.Config.Msg.GetLinux().GetCgroupParent()
	if parent == "" {
		return "", nil
	}
	return s.cgroups.Path(parent, containerID)
}

// placeVM moves the hypervisor, with its threads and any process it started, into the pod's
// cgroup. It returns the cgroup and the topmost cgroup it had to make, also on failure (for the
// caller's cleanup). A VM the kubelet cannot account for escapes the pod's limits and eviction,
// so a pod that names a cgroup parent and cannot get its VM there fails to start.
func (s *Runtime) placeVM(sb *store.Sandbox, c *store.Container, pid int) (cgroup, created string, err error) {
	if cgroup, err = s.vmCgroup(sb, c.ID); err != nil || cgroup == "" {
		return "", "", err
	}
	if pid <= 0 {
		// Writing 0 to cgroup.procs would move cocoon-cri itself.
		return "", "", fmt.Errorf("cocoon reported no hypervisor PID for VM %s, so it cannot be put into the pod's cgroup %s", c.VM.Name, cgroup)
	}
	pids, err := vmstats.Tree(procRoot, pid)
	if err != nil {
		return "", "", fmt.Errorf("find the hypervisor's processes: %w", err)
	}
	parent := sb.Config.Msg.GetLinux().GetCgroupParent()
	cgroup, created, err = s.cgroups.Place(parent, c.ID, pids)
	if err != nil {
		return cgroup, created, fmt.Errorf("put the hypervisor (pid %d) into the pod's cgroup: %w", pid, err)
	}
	s.log.Debug("hypervisor placed in the pod's cgroup", "container", c.ID, "cgroup", cgroup, "pids", pids)
	return cgroup, created, nil
}

// removeCgroup removes the cgroup a container's VM was in, once the VM is gone, waiting up to
// wait for exiting processes to leave it. A container whose start recorded no cgroup (a crash cut
// it short) may still have one: its name is deterministic.
func (s *Runtime) removeCgroup(ctx context.Context, sb *store.Sandbox, c *store.Container, created string, wait time.Duration) error {
	cgroup := c.VM.Cgroup
	if cgroup == "" {
		var err error
		if cgroup, err = s.vmCgroup(sb, c.ID); err != nil || cgroup == "" {
			return nil //nolint:nilerr // a parent the start refused made no cgroup
		}
	}
	if created == "" {
		created = c.VM.CgroupCreated
	}
	if err := s.dropCgroup(ctx, cgroup, created, wait); err != nil {
		return fmt.Errorf("remove the cgroup of container %s: %w", c.ID, err)
	}
	return nil
}

// dropCgroup removes cgroup, and the parents up to created that cocoon-cri made, waiting up to wait
// for exiting processes to leave.
func (s *Runtime) dropCgroup(ctx context.Context, cgroup, created string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return s.cgroups.Remove(ctx, cgroup, created)
}

// releaseCgroup removes an exited container's cgroup as soon as its VM is gone, so an ended VM
// leaves no empty cgroup under the pod while the kubelet keeps the container for its logs.
// RemoveContainer tries again, so a cgroup still busy is only logged here.
func (s *Runtime) releaseCgroup(c *store.Container) {
	if c.VM.Cgroup == "" {
		return
	}
	if err := s.dropCgroup(context.Background(), c.VM.Cgroup, c.VM.CgroupCreated, cgroupRemoveWait); err != nil {
		s.log.Warn("the cgroup of an exited VM is still in use; removing the container retries", "container", c.ID, "err", err)
	}
}

package cgroups

import (
	"context"
	"errors"
	"fmt"
	"sync"

	oc "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/systemd"
)

// The drivers' names, as the kubelet's cgroupDriver setting spells them.
const (
	Cgroupfs = "cgroupfs"
	Systemd  = "systemd"
)

// Driver places a VM's processes in its pod's cgroup the way the kubelet's cgroup driver expects,
// and takes them out again. The kubelet and cocoon-cri must use the same driver: the kubelet
// makes the pod's cgroup with its driver and passes it as cgroup_parent in that driver's form.
type Driver interface {
	// Name is Cgroupfs or Systemd.
	Name() string
	// CheckParent says whether parent, a pod's cgroup_parent, is one this driver places VMs
	// under. An empty parent passes: the VM then stays where cocoon started it.
	CheckParent(parent string) error
	// Path is the cgroup, as /proc/<pid>/cgroup shows it, that the VM of container id joins under
	// parent.
	Path(parent, id string) (string, error)
	// Place moves pids, the hypervisor first and then the processes it started, into the cgroup of
	// container id under parent. It returns that cgroup and the topmost cgroup it made, which
	// Remove takes; on failure too, where something may have been made.
	Place(parent, id string, pids []int) (cgroup, created string, err error)
	// Remove takes back what Place made once the VM is gone, retrying until ctx ends while
	// exiting processes keep it busy. Nothing left to remove is not an error.
	Remove(ctx context.Context, cgroup, created string) error
}

// New returns the named driver. The systemd driver needs a running systemd and fails here
// without one, so a misconfigured node is told at start rather than at its first pod.
func New(driver string) (Driver, error) {
	switch driver {
	case Cgroupfs:
		// Detected on first use: a node whose pods name no cgroup parent needs no cgroups.
		return cgroupfsDriver{host: sync.OnceValues(Detect)}, nil
	case Systemd:
		if !systemd.IsRunningSystemd() {
			return nil, errors.New("the systemd cgroup driver needs systemd running as PID 1 and its D-Bus API, " +
				"but /run/systemd/system does not exist (systemd makes it at boot; sd_booted(3) checks the same): " +
				"start cocoon-cri with --cgroup-driver cgroupfs, and set the kubelet's cgroupDriver to cgroupfs too")
		}
		return systemdDriver{unified: oc.IsCgroup2UnifiedMode()}, nil
	}
	return nil, fmt.Errorf("unknown cgroup driver %q: use %q or %q, the kubelet's cgroupDriver", driver, Cgroupfs, Systemd)
}

// cgroupfsDriver is Host behind the Driver interface.
type cgroupfsDriver struct {
	host func() (*Host, error)
}

func (cgroupfsDriver) Name() string { return Cgroupfs }

func (cgroupfsDriver) CheckParent(parent string) error { return CheckParent(parent) }

func (cgroupfsDriver) Path(parent, id string) (string, error) { return Path(parent, id) }

func (d cgroupfsDriver) Place(parent, id string, pids []int) (cgroup, created string, err error) {
	if cgroup, err = Path(parent, id); err != nil {
		return "", "", err
	}
	host, err := d.host()
	if err != nil {
		return "", "", fmt.Errorf("cgroups are not usable: %w", err)
	}
	created, err = host.Place(cgroup, pids)
	return cgroup, created, err
}

func (d cgroupfsDriver) Remove(ctx context.Context, cgroup, created string) error {
	host, err := d.host()
	if err != nil {
		return nil //nolint:nilerr // without usable cgroups Place made nothing
	}
	return host.Remove(ctx, cgroup, created)
}

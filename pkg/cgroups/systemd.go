package cgroups

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	oc "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/systemd"
)

// scopePrefix starts the name of every scope cocoon-cri makes, cocoon-cri-<container ID>.scope,
// as containerd's start with cri-containerd: an operator tells them apart in systemctl.
const scopePrefix = "cocoon-cri"

// systemdDriver has systemd make each VM a transient scope in the pod's slice over D-Bus, through
// opencontainers/cgroups' systemd managers (runc's). systemd then owns the scope's cgroup, so it
// goes by stopping the unit, not by rmdir behind systemd's back.
type systemdDriver struct {
	// unified picks the manager for a v2 host; a v1 or hybrid host has the legacy one.
	unified bool
}

func (systemdDriver) Name() string { return Systemd }

func (systemdDriver) CheckParent(parent string) error {
	if parent == "" {
		return nil
	}
	_, _, err := podSlice(parent)
	return err
}

// Path is <the slice's path>/cocoon-cri-<id>.scope, where systemd makes the scope.
func (systemdDriver) Path(parent, id string) (string, error) {
	_, _, cgroup, err := scope(parent, id)
	return cgroup, err
}

// scope is the slice unit parent names, the scope unit of container id in it, and the scope's
// cgroup.
func scope(parent, id string) (slice, unit, cgroup string, err error) {
	slice, expanded, err := podSlice(parent)
	if err != nil {
		return "", "", "", err
	}
	if unit, err = scopeUnit(id); err != nil {
		return "", "", "", err
	}
	return slice, unit, path.Join(expanded, unit), nil
}

// podSlice is the slice unit a cgroup_parent names and the cgroup systemd gives it. The kubelet
// passes the slice's path (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice),
// whose last element containerd and CRI-O take as the unit; the bare unit name is taken too. A
// path elsewhere than systemd puts its last element is refused: the VM would not be where the
// kubelet looks.
func podSlice(parent string) (slice, expanded string, err error) {
	if strings.Contains(parent, ":") {
		return "", "", fmt.Errorf("cgroup_parent %q is in runc's slice:prefix:name form; the systemd cgroup driver takes the pod's slice, such as kubepods-burstable-pod<uid>.slice or its path", parent)
	}
	slice = path.Base(parent)
	if !strings.HasSuffix(slice, ".slice") {
		return "", "", fmt.Errorf("cgroup_parent %q is not a systemd slice, as the systemd cgroup driver needs "+
			"(such as /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice); "+
			"a path such as /kubepods/burstable/pod<uid> means the kubelet uses the cgroupfs driver: start cocoon-cri with --cgroup-driver cgroupfs", parent)
	}
	if expanded, err = systemd.ExpandSlice(slice); err != nil {
		return "", "", fmt.Errorf("cgroup_parent %q: %w", parent, err)
	}
	if strings.Contains(parent, "/") && path.Clean("/"+parent) != expanded {
		return "", "", fmt.Errorf("cgroup_parent %q is not where systemd puts slice %s (%s)", parent, slice, expanded)
	}
	return slice, expanded, nil
}

// scopeUnit is the scope unit of container id. systemd takes only these characters in a unit
// name, and the library would make a slice, not a scope, of a name ending in .slice.
func scopeUnit(id string) (string, error) {
	if err := checkName(id); err != nil {
		return "", err
	}
	notUnitChar := func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}
	if strings.ContainsFunc(id, notUnitChar) || strings.HasSuffix(id, ".slice") {
		return "", fmt.Errorf("container ID %q cannot name a systemd scope", id)
	}
	return scopePrefix + "-" + id + ".scope", nil
}

// scopeOf is the slice and container ID of a cgroup Path made, for Remove, which has only the
// cgroup the start recorded.
func (d systemdDriver) scopeOf(cgroup string) (slice, id string, err error) {
	dir, unit := path.Split(cgroup)
	slice = path.Base(dir)
	id, isOurs := strings.CutPrefix(unit, scopePrefix+"-")
	id, isScope := strings.CutSuffix(id, ".scope")
	if p, pathErr := d.Path(slice, id); !isOurs || !isScope || pathErr != nil || p != cgroup {
		return "", "", fmt.Errorf("cgroup %s is not a scope cocoon-cri's systemd driver makes (was the VM placed with the cgroupfs driver?)", cgroup)
	}
	return slice, id, nil
}

// manager is the library's manager for container id's scope in slice. It sets no resources: the
// pod's slice already limits the VM. Devices are skipped so that the scope gets no device rules
// of its own: the hypervisor needs /dev/kvm, /dev/net/tun and /dev/vhost-*.
func (d systemdDriver) manager(slice, id string) (oc.Manager, error) {
	cg := &oc.Cgroup{
		Parent:      slice,
		ScopePrefix: scopePrefix,
		Name:        id,
		Resources:   &oc.Resources{SkipDevices: true},
	}
	if d.unified {
		return systemd.NewUnifiedManager(cg, "")
	}
	return systemd.NewLegacyManager(cg, nil)
}

// Place starts the scope with the hypervisor, as runc starts a container's, then moves the
// processes it started into the scope's cgroups. The cgroup is returned as the one made, for
// Remove to stop the unit; systemd's slices above it are the kubelet's.
func (d systemdDriver) Place(parent, id string, pids []int) (cgroup, created string, err error) {
	slice, unit, cgroup, err := scope(parent, id)
	if err != nil {
		return "", "", err
	}
	if len(pids) == 0 {
		return "", "", errors.New("a systemd scope cannot start without a process")
	}
	m, err := d.manager(slice, id)
	if err != nil {
		return "", "", fmt.Errorf("systemd scope %s in %s: %w", unit, slice, err)
	}
	if err := m.Apply(pids[0]); err != nil {
		return cgroup, cgroup, fmt.Errorf("start systemd scope %s in %s with process %d: %w", unit, slice, pids[0], err)
	}
	if err := join(m.GetPaths(), pids[1:]); err != nil {
		return cgroup, cgroup, fmt.Errorf("systemd scope %s in %s: %w", unit, slice, err)
	}
	return cgroup, cgroup, nil
}

// join moves pids into a unit's cgroup in every hierarchy, paths being the manager's (by
// controller). systemd was given only the hypervisor: the processes it started already run, and
// are moved as runc moves a process exec'd into a running container, through cgroupfs, which a
// scope with Delegate= allows. A hierarchy the unit has no cgroup in holds no hypervisor either.
func join(paths map[string]string, pids []int) error {
	if len(pids) == 0 {
		return nil
	}
	for _, controller := range slices.Sorted(maps.Keys(paths)) {
		dir := paths[controller]
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := enter(dir, pids); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// Remove stops the scope; systemd kills what is left in it and removes its cgroup, and the
// library then removes the cgroups it made itself in hierarchies systemd does not manage. A unit
// already gone is not an error.
func (d systemdDriver) Remove(ctx context.Context, cgroup, _ string) error {
	if cgroup == "" {
		return nil
	}
	slice, id, err := d.scopeOf(cgroup)
	if err != nil {
		return err
	}
	m, err := d.manager(slice, id)
	if err != nil {
		return fmt.Errorf("systemd scope for %s: %w", cgroup, err)
	}
	if err := retry(ctx, func() (bool, error) {
		err := m.Destroy()
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("stop systemd scope %s in %s: %w", path.Base(cgroup), slice, err)
	}
	return nil
}

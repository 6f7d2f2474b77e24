// Package cgroups puts a VM's hypervisor process, and the processes it started, into the pod's
// cgroup the way the kubelet's cgroup driver expects, so the kubelet's pod limits fence the VM and
// cAdvisor, eviction and kubectl top see its CPU and memory. The cgroupfs driver (Host) makes
// <cgroup_parent>/<container ID> itself in every v1 hierarchy on a v1 or hybrid host, or in the
// unified hierarchy on a v2 host, with opencontainers/cgroups (runc's library) finding the
// hierarchies, setting new cgroups up, moving processes and removing cgroups. The systemd driver has systemd make a transient scope in the
// pod's slice, as runc does. New picks one; both implement Driver.
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	oc "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
)

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	// Mount is where it is mounted; Root the cgroup the mount shows (not "/" inside a cgroup
	// namespace or for a bind mount of a subtree).
	Mount, Root string
	// Controllers are the v1 controllers bound to it ("systemd" for the named hierarchy name=systemd); nil
	// for the unified hierarchy.
	Controllers []string
	// Unified marks the cgroup v2 hierarchy.
	Unified bool
}

// Host is the set of hierarchies a VM is placed in.
type Host struct {
	Hierarchies []Hierarchy
}

// skipped are v1 controllers a VM is not put under. The devices controller: the pod's device
// rules are written for containers, while the hypervisor needs /dev/kvm, /dev/net/tun and
// /dev/vhost-*, which a container never gets.
var skipped = []string{"devices"}

// Detect finds the hierarchies through opencontainers/cgroups, as runc does. On a v1 or hybrid
// host every v1 hierarchy but the skipped ones is used (the kubelet's cgroupfs driver makes pod
// cgroups in all of them), the first mount of each; the hybrid unified mount, which has no
// controllers the kubelet uses, is not. On a v2 host the unified hierarchy is used.
func Detect() (*Host, error) {
	if oc.IsCgroup2UnifiedMode() {
		mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
			return m.FSType != "cgroup2" || m.Mountpoint != fs2.UnifiedMountpoint, false
		})
		if err != nil || len(mounts) == 0 {
			return nil, fmt.Errorf("find the cgroup v2 mount at %s: %w", fs2.UnifiedMountpoint, err)
		}
		return &Host{Hierarchies: []Hierarchy{{Mount: mounts[0].Mountpoint, Root: mounts[0].Root, Unified: true}}}, nil
	}
	mounts, err := oc.GetCgroupMounts(false)
	if err != nil {
		return nil, fmt.Errorf("find the cgroup mounts: %w", err)
	}
	var v1 []Hierarchy
	for _, m := range mounts {
		if slices.ContainsFunc(m.Subsystems, func(c string) bool { return slices.Contains(skipped, c) }) {
			continue
		}
		v1 = append(v1, Hierarchy{Mount: m.Mountpoint, Root: m.Root, Controllers: slices.Sorted(slices.Values(m.Subsystems))})
	}
	if len(v1) == 0 {
		return nil, errors.New("no cgroup filesystem is mounted")
	}
	return &Host{Hierarchies: v1}, nil
}

// Path is the cgroup <parent>/<name> in cgroupfs form. A parent in runc's systemd form
// ("slice:prefix:name") is refused (CheckParent).
func Path(parent, name string) (string, error) {
	if err := CheckParent(parent); err != nil {
		return "", err
	}
	if err := checkName(name); err != nil {
		return "", err
	}
	return path.Join("/", parent, name), nil
}

// checkName refuses a name that would place a VM anywhere but directly under its parent.
func checkName(name string) error {
	if name == "" || strings.ContainsAny(name, "/:") || name == "." || name == ".." {
		return fmt.Errorf("cgroup name %q is not a single path element", name)
	}
	return nil
}

// CheckParent says whether parent is a cgroupfs path cocoon-cri can place VMs under.
func CheckParent(parent string) error {
	if strings.Contains(parent, ":") {
		return fmt.Errorf("cgroup_parent %q is in runc's systemd form (slice:prefix:name); the cgroupfs driver takes paths such as /kubepods/burstable/pod<uid>", parent)
	}
	return nil
}

// dir is where cgroup path is in hierarchy h.
func (h Hierarchy) dir(cgroup string) (string, error) {
	rel := cgroup
	if h.Root != "/" {
		var ok bool
		if rel, ok = strings.CutPrefix(cgroup, h.Root); !ok || (rel != "" && rel[0] != '/') {
			return "", fmt.Errorf("cgroup %s is outside %s, the part of the hierarchy mounted at %s", cgroup, h.Root, h.Mount)
		}
	}
	return filepath.Join(h.Mount, rel), nil
}

func (h Hierarchy) has(controller string) bool { return slices.Contains(h.Controllers, controller) }

func (h Hierarchy) String() string {
	if h.Unified {
		return h.Mount + " (unified)"
	}
	return h.Mount + " (" + strings.Join(h.Controllers, ",") + ")"
}

// Place makes cgroup (and any ancestor missing, as runc does) in every hierarchy and moves the
// processes pids into it, each with all its threads. It returns the topmost cgroup it made in
// every hierarchy, which Remove takes back with the leaf: an ancestor that existed in any
// hierarchy (the kubelet's pod cgroup) is never removed. A process that exits meanwhile is not an
// error; cgroup must not be "/". On failure whatever was made and is empty is removed.
func (h *Host) Place(cgroup string, pids []int) (created string, err error) {
	if cgroup == "/" || cgroup == "" {
		return "", errors.New("cannot place processes in the root cgroup")
	}
	created = "/"
	for _, hier := range h.Hierarchies {
		top, err := hier.create(cgroup)
		if top == "" {
			top = cgroup // the leaf is this container's even if a crashed start left it
		}
		if len(top) > len(created) {
			created = top
		}
		if err != nil {
			h.removeQuietly(cgroup, created)
			return "", err
		}
	}
	for _, hier := range h.Hierarchies {
		if err := hier.join(cgroup, pids); err != nil {
			return created, err
		}
	}
	return created, nil
}

func (h *Host) removeQuietly(cgroup, created string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = h.Remove(ctx, cgroup, created)
}

// create makes cgroup in the hierarchy, with the library setting up what a new cgroup needs before
// a process can join it: a v1 cpuset takes its parent's CPUs and memory nodes (it starts with none,
// and joining it would fail with ENOSPC), a v2 parent enables its controllers for its children
// (where it cannot, the VM is still accounted in the nearest ancestor that has them). It returns
// the topmost cgroup it made, "" when all existed.
func (h Hierarchy) create(cgroup string) (string, error) {
	top := ""
	for p := cgroup; p != "/"; p = path.Dir(p) {
		d, err := h.dir(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("cgroup %s in %s: %w", p, h, err)
		}
		top = p
	}
	d, _ := h.dir(cgroup)
	var err error
	switch {
	case h.Unified:
		err = fs2.CreateCgroupPath(d, &oc.Cgroup{Resources: &oc.Resources{}})
	case h.has("cpuset"):
		err = (&fs.CpusetGroup{}).ApplyDir(d, &oc.Resources{}, -1)
	default:
		err = os.MkdirAll(d, 0o755)
	}
	if err != nil {
		return top, fmt.Errorf("create cgroup %s in %s: %w", cgroup, h, err)
	}
	return top, nil
}

func (h Hierarchy) join(cgroup string, pids []int) error {
	d, err := h.dir(cgroup)
	if err != nil {
		return err
	}
	if err := enter(d, pids); err != nil {
		return fmt.Errorf("cgroup %s in %s: %w", cgroup, h, err)
	}
	return nil
}

// enter moves pids into the cgroup at dir through the library, which writes each to its
// cgroup.procs (the kernel moves the whole thread group) and retries a process the kernel is
// still creating. A process that exited meanwhile (ESRCH) is skipped.
func enter(dir string, pids []int) error {
	for _, pid := range pids {
		if err := oc.WriteCgroupProc(dir, pid); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
	}
	return nil
}

// Remove removes cgroup from every hierarchy, then its ancestors up to created (what Place made),
// each only if empty: an ancestor another VM still uses stays. Processes that are exiting keep
// a cgroup busy for a moment, so a busy cgroup is retried until ctx ends. A missing cgroup is
// not an error.
func (h *Host) Remove(ctx context.Context, cgroup, created string) error {
	if cgroup == "/" || cgroup == "" {
		return nil
	}
	var errs []error
	for _, hier := range h.Hierarchies {
		if err := hier.remove(ctx, cgroup); err != nil {
			errs = append(errs, err)
			continue
		}
		if created == "" || created == cgroup || !strings.HasPrefix(cgroup, created+"/") {
			continue
		}
		for p := path.Dir(cgroup); strings.HasPrefix(p+"/", created+"/"); p = path.Dir(p) {
			d, err := hier.dir(p)
			if err != nil {
				break
			}
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				break // still used by another cgroup
			}
		}
	}
	return errors.Join(errs...)
}

func (h Hierarchy) remove(ctx context.Context, cgroup string) error {
	d, err := h.dir(cgroup)
	if err != nil {
		return err
	}
	err = retry(ctx, func() (bool, error) {
		err := syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return true, nil
		}
		return !errors.Is(err, syscall.EBUSY), err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EBUSY):
		procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		return fmt.Errorf("remove cgroup %s in %s: still busy (processes: %s): %w", cgroup, h,
			strings.Join(strings.Fields(string(procs)), " "), err)
	default:
		return fmt.Errorf("remove cgroup %s in %s: %w", cgroup, h, err)
	}
}

// retry calls try until it is done or ctx ends, and returns its last error. Processes that are
// exiting keep a cgroup busy for a moment after the VM is gone, so removal is tried again.
func retry(ctx context.Context, try func() (done bool, err error)) error {
	for {
		done, err := try()
		if done {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Package cgroups puts a VM's hypervisor process, and the processes it started, into the pod's
// cgroup the way the kubelet's cgroup driver expects, so the kubelet's pod limits fence the VM and
// cAdvisor, eviction and kubectl top see its CPU and memory. The cgroupfs driver (Host) makes
// <cgroup_parent>/<container ID> itself in every v1 hierarchy on a v1 or hybrid host, or in the
// unified hierarchy on a v2 host. The systemd driver has systemd make a transient scope in the
// pod's slice, as runc does. New picks one; both implement Driver.
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	// Mount is where it is mounted; Root the cgroup the mount shows (not "/" inside a cgroup
	// namespace or for a bind mount of a subtree).
	Mount, Root string
	// Controllers are the v1 controllers bound to it ("name=systemd" for a named hierarchy); nil
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

// Detect finds the hierarchies from this process's mount table. On a v1 or hybrid host every v1
// hierarchy but the skipped ones is used (the kubelet's cgroupfs driver makes pod cgroups in all
// of them) and the hybrid unified mount, which has no controllers the kubelet uses, is not. On a
// v2 host the unified hierarchy is used.
func Detect() (*Host, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return ParseMountInfo(data)
}

// ParseMountInfo picks the hierarchies from a mountinfo table (proc(5)).
func ParseMountInfo(data []byte) (*Host, error) {
	var v1 []Hierarchy
	var unified *Hierarchy
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			return nil, fmt.Errorf("mountinfo: no separator in %q", line)
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(sf) < 3 {
			return nil, fmt.Errorf("mountinfo: short line %q", line)
		}
		root, mount := unescape(pf[3]), unescape(pf[4])
		switch sf[0] {
		case "cgroup2":
			if unified == nil {
				unified = &Hierarchy{Mount: mount, Root: root, Unified: true}
			}
		case "cgroup":
			var controllers []string
			for _, opt := range strings.Split(sf[2], ",") {
				// Mount options are not controllers; a named hierarchy is "name=<name>".
				isOption := slices.Contains([]string{"rw", "ro", "clone_children", "noprefix", "xattr", "cpuset_v2_mode"}, opt) ||
					(strings.Contains(opt, "=") && !strings.HasPrefix(opt, "name="))
				if isOption {
					continue
				}
				controllers = append(controllers, opt)
			}
			slices.Sort(controllers)
			if len(controllers) == 0 || slices.ContainsFunc(controllers, func(c string) bool { return slices.Contains(skipped, c) }) {
				continue
			}
			// A hierarchy may be mounted twice (a bind mount); the first mount of it serves.
			if slices.ContainsFunc(v1, func(h Hierarchy) bool { return slices.Equal(h.Controllers, controllers) }) {
				continue
			}
			v1 = append(v1, Hierarchy{Mount: mount, Root: root, Controllers: controllers})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	switch {
	case len(v1) > 0:
		return &Host{Hierarchies: v1}, nil
	case unified != nil:
		return &Host{Hierarchies: []Hierarchy{*unified}}, nil
	}
	return nil, errors.New("no cgroup filesystem is mounted")
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
		top, err := hier.makeDirs(cgroup)
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
		if err := hier.move(cgroup, pids); err != nil {
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

// makeDirs creates cgroup in the hierarchy and returns the topmost directory it made (as a cgroup
// path), "" when all existed.
func (h Hierarchy) makeDirs(cgroup string) (string, error) {
	var missing []string
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
		missing = append(missing, p)
	}
	slices.Reverse(missing) // top down
	created := ""
	for _, p := range missing {
		d, _ := h.dir(p)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return created, fmt.Errorf("create cgroup %s in %s: %w", p, h, err)
		}
		if created == "" {
			created = p
		}
		if err := h.initDir(p); err != nil {
			return created, err
		}
	}
	return created, nil
}

// initDir prepares a new cgroup so processes can join it. A v1 cpuset starts with no CPUs and no
// memory nodes (unless the parent clones them), and joining it fails with ENOSPC: it takes its
// parent's. A v2 cgroup's controllers must be enabled in its parent's subtree_control; where they
// cannot be the VM is still accounted in the nearest ancestor that has them, so that is not fatal.
func (h Hierarchy) initDir(cgroup string) error {
	d, _ := h.dir(cgroup)
	parent := filepath.Dir(d)
	if h.Unified {
		avail, err := os.ReadFile(filepath.Join(parent, "cgroup.controllers"))
		if err != nil {
			return nil
		}
		for _, c := range strings.Fields(string(avail)) {
			_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
		return nil
	}
	if !h.has("cpuset") {
		return nil
	}
	for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
		own, err := os.ReadFile(filepath.Join(d, file))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", cgroup, err)
		}
		if len(bytes.TrimSpace(own)) > 0 {
			continue
		}
		inherited, err := os.ReadFile(filepath.Join(parent, file))
		if err != nil {
			return fmt.Errorf("cgroup %s: parent's %s: %w", cgroup, file, err)
		}
		if err := os.WriteFile(filepath.Join(d, file), bytes.TrimSpace(inherited), 0); err != nil {
			return fmt.Errorf("cgroup %s: set %s to its parent's %q: %w", cgroup, file, bytes.TrimSpace(inherited), err)
		}
	}
	return nil
}

func (h Hierarchy) move(cgroup string, pids []int) error {
	d, err := h.dir(cgroup)
	if err != nil {
		return err
	}
	if err := enter(d, pids); err != nil {
		return fmt.Errorf("cgroup %s in %s: %w", cgroup, h, err)
	}
	return nil
}

// enter moves pids into the cgroup at dir by writing each to its cgroup.procs: the kernel moves
// the whole thread group. One write per PID, so a process that exited meanwhile (ESRCH) fails
// only its own write; each ends in a newline, as the kernel accepts, so a directory standing in
// for a cgroup in tests keeps every PID. The file is not created: a directory without one is not
// a cgroup.
func enter(dir string, pids []int) error {
	if len(pids) == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, pid := range pids {
		_, err := f.WriteString(strconv.Itoa(pid) + "\n")
		if errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			return fmt.Errorf("move process %d: %w", pid, err)
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

package harness

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// CgroupParent is a cgroup path the test owns. It is removed from every hierarchy when the
// test ends, also when it fails, after the node (and with it every VM) is gone: register it before
// PrepareNode, since cleanups run last-registered first. Its name holds this process's identity,
// for SweepStale to remove it should the process be killed first.
func CgroupParent(t testproc.TB) string {
	t.Helper()
	self, err := stale.Self()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	parent := "/" + testCgroupPrefix + stale.FormatOwner(self) + "-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		if err := removeCgroupTree(parent); err != nil {
			t.Errorf("remove the test cgroup: %v", err)
		}
	})
	return parent
}

// testCgroupPrefix begins the name of every cgroup of CgroupParent.
const testCgroupPrefix = "cocoon-cri-e2e-"

// removeCgroupTree removes cgroup, and every cgroup below it, from every hierarchy, once the
// processes in them are gone.
func removeCgroupTree(cgroup string) error {
	var errs []error
	for _, d := range CgroupDirs(cgroup) {
		var dirs []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, dir := range slices.Backward(dirs) { // children first
			if err := removeCgroupDir(dir); err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			}
		}
	}
	return errors.Join(errs...)
}

// sweepTestCgroups removes the cgroups of CgroupParent whose owners have ended, killing what
// still runs in them first.
func sweepTestCgroups() error {
	var errs []error
	for _, name := range staleTestCgroups() {
		var pids []int
		for _, d := range CgroupDirs("/" + name) {
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.Name() == "cgroup.procs" {
					data, _ := os.ReadFile(p)
					for _, f := range strings.Fields(string(data)) {
						if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
							pids = append(pids, pid)
						}
					}
				}
				return nil
			})
		}
		if left := stale.KillAll(pids, 30*time.Second); len(left) > 0 {
			errs = append(errs, fmt.Errorf("the test cgroup %s: processes %v outlived SIGKILL", name, left))
			continue
		}
		if err := removeCgroupTree("/" + name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// staleTestCgroups lists the top cgroups of CgroupParent, in any hierarchy, whose owners have
// ended.
func staleTestCgroups() []string {
	var ended []string
	found, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", testCgroupPrefix+"*"))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", testCgroupPrefix+"*"))
	for _, d := range append(found, v2...) {
		name := filepath.Base(d)
		tag, _, _ := strings.Cut(strings.TrimPrefix(name, testCgroupPrefix), "-")
		if id, ok := stale.ParseOwner(tag); ok && !id.Alive("/proc") && !slices.Contains(ended, name) {
			ended = append(ended, name)
		}
	}
	return ended
}

// MakeCgroup creates cgroup in every hierarchy under /sys/fs/cgroup (v1) or in the unified one,
// with the cpusets of the root, which a new v1 cpuset lacks.
func MakeCgroup(t testproc.TB, cgroup string) {
	t.Helper()
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		entries = nil // v2: one hierarchy
		if err := os.MkdirAll(filepath.Join("/sys/fs/cgroup", cgroup), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		hierarchy := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(hierarchy, "cgroup.procs")); err != nil {
			continue // not a v1 hierarchy (or a link to one)
		}
		dir := filepath.Join(hierarchy, cgroup)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if data, err := os.ReadFile(filepath.Join(hierarchy, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// CgroupDirs lists where cgroup exists, in every hierarchy under /sys/fs/cgroup.
func CgroupDirs(cgroup string) []string {
	var found []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		d := filepath.Join("/sys/fs/cgroup", e.Name(), cgroup)
		if _, err := os.Stat(d); err == nil {
			found = append(found, d)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", cgroup, "cgroup.procs")); err == nil {
		found = append(found, filepath.Join("/sys/fs/cgroup", cgroup)) // cgroup v2
	}
	return found
}

// poolCgroupRoot is where cocoon-cri's cgroupfs driver accounts warm pool VMs.
const poolCgroupRoot = "/cocoon-cri-pool/"

// poolCgroups lists the warm pool cgroups that processes running for the node are in: a daemon's
// stop leaves its pool VMs running, for the next start to adopt, and a test has no next start.
func (n *Node) poolCgroups() []string {
	return poolCgroupsOf(stale.ProcessesWhose(func(args string) bool { return strings.Contains(args, n.RunDir+"/") }))
}

// RemovePoolCgroupParent removes the warm pools' parent cgroup from every hierarchy once the run's
// daemons are gone: a daemon leaves it when its pool VMs outlive it (a test's node removes their
// cgroups, not the parent they share with other nodes'). Only an empty cgroup can go: one that a
// daemon outside the run still uses stays, and is no error.
func RemovePoolCgroupParent() error {
	var errs []error
	for _, d := range CgroupDirs(poolCgroupRoot) {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("remove the warm pools' cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// poolCgroupsOf lists the warm pool cgroups that pids are in.
func poolCgroupsOf(pids []int) []string {
	var found []string
	for _, pid := range pids {
		data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
		for line := range strings.Lines(string(data)) {
			parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
			if len(parts) == 3 && strings.HasPrefix(parts[2], poolCgroupRoot) && !slices.Contains(found, parts[2]) {
				found = append(found, parts[2])
			}
		}
	}
	return found
}

// removeCgroups removes cgroups from every hierarchy.
func removeCgroups(cgroups []string) error {
	var errs []error
	for _, cgroup := range cgroups {
		for _, d := range CgroupDirs(cgroup) {
			if err := removeCgroupDir(d); err != nil {
				errs = append(errs, fmt.Errorf("remove the pool cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeCgroupDir removes the cgroup directory d once the processes in it are gone: killed ones
// hold a cgroup until they are reaped. Gone already is not an error.
func removeCgroupDir(d string) error {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := os.Remove(d)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

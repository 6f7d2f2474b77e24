package harness

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// CgroupParent is a cgroup path the test owns. It is removed from every hierarchy when the
// test ends, also when it fails, after the node (and with it every VM) is gone: register it before
// PrepareNode, since cleanups run last-registered first.
func CgroupParent(t testproc.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	parent := "/cocoon-cri-e2e-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		for _, d := range CgroupDirs(parent) {
			var dirs []string
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			slices.Reverse(dirs) // children first
			for _, dir := range dirs {
				if err := removeCgroupDir(dir); err != nil {
					t.Errorf("remove test cgroup %s: %v", dir, err)
				}
			}
		}
	})
	return parent
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
	var found []string
	for _, pid := range ProcessesWhose(func(args string) bool { return strings.Contains(args, n.RunDir+"/") }) {
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
func (n *Node) removeCgroups(cgroups []string) {
	for _, cgroup := range cgroups {
		for _, d := range CgroupDirs(cgroup) {
			if err := removeCgroupDir(d); err != nil {
				n.T.Errorf("remove the pool cgroup %s: %v", d, err)
			}
		}
	}
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

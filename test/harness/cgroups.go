package harness

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
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
				// Killed processes hold a cgroup until they are reaped.
				var err error
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
					if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
						break
					}
				}
				if err != nil && !errors.Is(err, os.ErrNotExist) {
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

package cgroups

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDetectOnThisHost: the hierarchies are those this process's /proc/self/cgroup names, less the
// devices one; on a v1 or hybrid host not the unified one.
func TestDetectOnThisHost(t *testing.T) {
	h, err := Detect()
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" || parts[1] == "devices" {
			continue
		}
		want = append(want, strings.TrimPrefix(parts[1], "name="))
	}
	for _, hier := range h.Hierarchies {
		if hier.Unified {
			if len(h.Hierarchies) != 1 || len(want) != 0 {
				t.Fatalf("the unified hierarchy beside v1 ones: %v", h.Hierarchies)
			}
			return
		}
		if hier.has("devices") {
			t.Errorf("the devices hierarchy is used: %s", hier)
		}
		got = append(got, strings.Join(hier.Controllers, ","))
		if _, err := os.Stat(filepath.Join(hier.Mount, "cgroup.procs")); err != nil {
			t.Errorf("%s is no cgroup mount: %v", hier, err)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("hierarchies %v, want %v", got, want)
	}
}

// TestHierarchyDir: a mount that shows part of a hierarchy (a cgroup namespace, a bind mount of a
// subtree) holds only the cgroups under its root.
func TestHierarchyDir(t *testing.T) {
	h := Hierarchy{Mount: "/sys/fs/cgroup", Root: "/kubepods", Unified: true}
	d, err := h.dir("/kubepods/pod1/c1")
	if err != nil || d != "/sys/fs/cgroup/pod1/c1" {
		t.Fatalf("dir in a namespaced mount: %q, %v", d, err)
	}
	if _, err := h.dir("/kubepodsX/c1"); err == nil {
		t.Fatal("a cgroup outside the mounted subtree was accepted")
	}
	whole := Hierarchy{Mount: "/sys/fs/cgroup/memory", Root: "/", Controllers: []string{"memory"}}
	if d, err := whole.dir("/kubepods/pod1/c1"); err != nil || d != "/sys/fs/cgroup/memory/kubepods/pod1/c1" {
		t.Fatalf("dir in a whole hierarchy: %q, %v", d, err)
	}
}

func TestPath(t *testing.T) {
	for _, c := range []struct{ parent, name, want string }{
		{"/kubepods/burstable/pod123", "abc", "/kubepods/burstable/pod123/abc"},
		{"kubepods/pod1/", "abc", "/kubepods/pod1/abc"},
		{"/a/../../b", "abc", "/b/abc"},
	} {
		if got, err := Path(c.parent, c.name); err != nil || got != c.want {
			t.Errorf("Path(%q, %q) = %q, %v, want %q", c.parent, c.name, got, err, c.want)
		}
	}
	for _, c := range []struct{ parent, name string }{
		{"kubepods-burstable.slice:cri-containerd:abc", "abc"},
		{"/kubepods", "a/b"},
		{"/kubepods", ".."},
		{"/kubepods", ""},
	} {
		if _, err := Path(c.parent, c.name); err == nil {
			t.Errorf("Path(%q, %q) succeeded", c.parent, c.name)
		}
	}
}

// realHost is this machine's cgroups, or a skip where the test cannot write them.
func realHost(t *testing.T) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to write cgroups")
	}
	h, err := Detect()
	if err != nil {
		t.Skipf("no cgroups: %v", err)
	}
	return h
}

// testParent is a cgroup name no one else uses; the test removes it from every hierarchy even if
// it fails.
func testParent(t *testing.T, h *Host) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	parent := "/cocoon-cri-test-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		for _, hier := range h.Hierarchies {
			d, err := hier.dir(parent)
			if err != nil {
				continue
			}
			// Deepest first; what is left busy is reported.
			var dirs []string
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			slices.Reverse(dirs)
			for _, dir := range dirs {
				if err := removeOnceEmpty(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("clean up %s: %v", dir, err)
				}
			}
		}
	})
	return parent
}

// removeOnceEmpty removes a cgroup directory, waiting up to a minute while it is busy: the test's
// processes were killed before, and a killed process leaves its cgroups only once it has exited.
func removeOnceEmpty(dir string) error {
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		err := os.Remove(dir)
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
	}
}

// startTree starts a shell with a child: a hypervisor with a process of its own.
func startTree(t *testing.T) (*exec.Cmd, []int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 600 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	var childPID int
	buf := make([]byte, 32)
	n, err := out.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if childPID, err = strconv.Atoi(strings.TrimSpace(string(buf[:n]))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killPID(childPID) })
	return cmd, []int{cmd.Process.Pid, childPID}
}

func killPID(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}

// assertGone fails t unless cgroup is gone from every hierarchy.
func assertGone(t *testing.T, h *Host, cgroup string) {
	t.Helper()
	for _, hier := range h.Hierarchies {
		d, _ := hier.dir(cgroup)
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after Remove: %v", d, err)
		}
	}
}

// inCgroup reports whether /proc/<pid>/cgroup puts pid in cgroup for the given controller ("" for
// the unified hierarchy).
func inCgroup(t *testing.T, pid int, controller, cgroup string) bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (slices.Contains(strings.Split(parts[1], ","), controller) || controller == "" && parts[0] == "0") {
			return parts[2] == cgroup
		}
	}
	return false
}

// TestPlaceAndRemoveOnThisHost moves a real process tree into a cgroup under a parent that does
// not exist yet, checks the kernel sees it there in the memory, cpu and cpuset hierarchies, and
// checks that nothing is left after removal.
func TestPlaceAndRemoveOnThisHost(t *testing.T) {
	h := realHost(t)
	parent := testParent(t, h)
	cgroup, err := Path(parent+"/pod", "ctr1")
	if err != nil {
		t.Fatal(err)
	}
	cmd, pids := startTree(t)

	created, err := h.Place(cgroup, pids)
	if err != nil {
		t.Fatal(err)
	}
	if created != parent {
		t.Fatalf("Place made %q on top, want %q (the parent did not exist)", created, parent)
	}
	procs, err := procsOf(h, cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, hier := range h.Hierarchies {
		got := procs[hier.Mount]
		slices.Sort(got)
		want := slices.Sorted(slices.Values(pids))
		if !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", hier, got, want)
		}
	}
	controllers := []string{"memory", "cpu", "cpuacct", "cpuset", "pids"}
	if h.Hierarchies[0].Unified {
		controllers = []string{""}
	}
	for _, controller := range controllers {
		if !h.uses(controller) {
			continue
		}
		for _, pid := range pids {
			if !inCgroup(t, pid, controller, cgroup) {
				t.Errorf("/proc/%d/cgroup does not put it in %s for %s", pid, cgroup, controller)
			}
		}
	}

	// Busy while the processes live.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Remove(cancelled, cgroup, created); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("Remove of a cgroup with processes: %v", err)
	}

	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	killPID(pids[1])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Remove(ctx, cgroup, created); err != nil {
		t.Fatal(err)
	}
	assertGone(t, h, parent)
	// Removing again is fine.
	if err := h.Remove(ctx, cgroup, created); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveKeepsAParentItDidNotMake: a pod cgroup the kubelet made stays, and so does a parent
// another VM still uses.
func TestRemoveKeepsAParentItDidNotMake(t *testing.T) {
	h := realHost(t)
	parent := testParent(t, h)
	for _, hier := range h.Hierarchies {
		if _, err := hier.create(parent); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := Path(parent, "a")
	createdA, err := h.Place(a, nil)
	if err != nil || createdA != a {
		t.Fatalf("Place under an existing parent: created %q, %v; want the leaf only", createdA, err)
	}
	// b's parent dir is new, shared with c.
	b, _ := Path(parent+"/shared", "b")
	c, _ := Path(parent+"/shared", "c")
	createdB, err := h.Place(b, nil)
	if err != nil || createdB != parent+"/shared" {
		t.Fatalf("Place b: %q, %v", createdB, err)
	}
	createdC, err := h.Place(c, nil)
	if err != nil || createdC != c {
		t.Fatalf("Place c: %q, %v", createdC, err)
	}
	ctx := context.Background()
	for _, r := range []struct{ cgroup, created string }{{a, createdA}, {b, createdB}} {
		if err := h.Remove(ctx, r.cgroup, r.created); err != nil {
			t.Fatal(err)
		}
	}
	for _, hier := range h.Hierarchies {
		for cg, exists := range map[string]bool{parent: true, parent + "/shared": true, c: true, a: false, b: false} {
			d, _ := hier.dir(cg)
			if _, err := os.Stat(d); (err == nil) != exists {
				t.Errorf("%s: exists=%v, want %v", d, err == nil, exists)
			}
		}
	}
}

// TestPlaceUnderAParentSomeHierarchiesHave: an ancestor that existed in one hierarchy is not
// removed from any, even where Place made it.
func TestPlaceUnderAParentSomeHierarchiesHave(t *testing.T) {
	h := realHost(t)
	if len(h.Hierarchies) < 2 {
		t.Skip("needs two hierarchies")
	}
	parent := testParent(t, h)
	first := h.Hierarchies[0]
	d, _ := first.dir(parent)
	if _, err := first.create(parent); err != nil {
		t.Fatal(err)
	}
	leaf, _ := Path(parent, "x")
	created, err := h.Place(leaf, nil)
	if err != nil || created != leaf {
		t.Fatalf("Place: created %q, %v; want only the leaf to be cocoon-cri's", created, err)
	}
	if err := h.Remove(context.Background(), leaf, created); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d); err != nil {
		t.Fatalf("the parent that existed in %s went: %v", first, err)
	}
}

func TestPlaceRefusesTheRoot(t *testing.T) {
	h := &Host{Hierarchies: []Hierarchy{{Mount: t.TempDir(), Root: "/", Controllers: []string{"memory"}}}}
	if _, err := h.Place("/", []int{1}); err == nil {
		t.Fatal("placed processes in the root cgroup")
	}
}

func (h *Host) uses(controller string) bool {
	return slices.ContainsFunc(h.Hierarchies, func(hier Hierarchy) bool { return hier.has(controller) || (hier.Unified && controller == "") })
}

// procsOf lists the processes in cgroup in every hierarchy, by hierarchy mount.
func procsOf(h *Host, cgroup string) (map[string][]int, error) {
	out := map[string][]int{}
	for _, hier := range h.Hierarchies {
		d, err := hier.dir(cgroup)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return nil, fmt.Errorf("cgroup %s in %s: %w", cgroup, hier, err)
		}
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("cgroup %s in %s: %w", cgroup, hier, err)
			}
			out[hier.Mount] = append(out[hier.Mount], pid)
		}
	}
	return out, nil
}

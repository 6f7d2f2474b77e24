package cgroups

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oc "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/systemd"
)

const testID = "0123456789abcdef"

func TestSystemdPath(t *testing.T) {
	d := systemdDriver{}
	for _, c := range []struct{ parent, want string }{
		// The kubelet's form: the slice's path.
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123.slice",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123.slice/cocoon-cri-" + testID + ".scope"},
		// The bare unit names.
		{"kubepods-burstable-pod123.slice",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123.slice/cocoon-cri-" + testID + ".scope"},
		{"kubepods-besteffort-pod123.slice",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cocoon-cri-" + testID + ".scope"},
		// A guaranteed pod's slice is right under kubepods; the kubelet writes a UID's dashes as _.
		{"kubepods-pod8f0e_41b2_9c3d.slice",
			"/kubepods.slice/kubepods-pod8f0e_41b2_9c3d.slice/cocoon-cri-" + testID + ".scope"},
		{"kubepods.slice/kubepods-pod1.slice/", "/kubepods.slice/kubepods-pod1.slice/cocoon-cri-" + testID + ".scope"},
	} {
		got, err := d.Path(c.parent, testID)
		if err != nil || got != c.want {
			t.Errorf("Path(%q) = %q, %v; want %q", c.parent, got, err, c.want)
		}
		if err := d.CheckParent(c.parent); err != nil {
			t.Errorf("CheckParent(%q): %v", c.parent, err)
		}
	}
	if err := d.CheckParent(""); err != nil {
		t.Errorf("CheckParent of no parent: %v", err)
	}
}

func TestSystemdParentRefused(t *testing.T) {
	d := systemdDriver{}
	for _, c := range []struct{ parent, says string }{
		{"/kubepods/burstable/pod123", "--cgroup-driver cgroupfs"},
		{"kubepods", "not a systemd slice"},
		{"kubepods-burstable.slice:cri-containerd:abc", "slice:prefix:name"},
		{"kubepods--burstable.slice", "invalid slice name"},
		{"-kubepods.slice", "invalid slice name"},
		{".slice", "invalid slice name"},
		// The unit is real, but the VM would not be under the path the kubelet watches.
		{"/system.slice/kubepods-pod1.slice", "not where systemd puts"},
		{"/kubepods-pod1.slice", "not where systemd puts"},
	} {
		err := d.CheckParent(c.parent)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("CheckParent(%q) = %v; want an error saying %q", c.parent, err, c.says)
		}
		if _, err := d.Path(c.parent, testID); err == nil {
			t.Errorf("Path(%q) succeeded", c.parent)
		}
	}
}

func TestSystemdIDRefused(t *testing.T) {
	d := systemdDriver{}
	for _, bad := range []string{"", ".", "..", "a/b", "a:b", `a\x2db`, "a b", "x.slice"} {
		if p, err := d.Path("kubepods-pod1.slice", bad); err == nil {
			t.Errorf("Path for container ID %q = %q", bad, p)
		}
	}
}

// TestSystemdScopeWhereTheLibraryPutsIt: the manager Place uses puts the scope at Path in every
// hierarchy of this host (no D-Bus is needed to build it), so the cgroup recorded, and the one
// the kubelet looks under, is where the VM is.
func TestSystemdScopeWhereTheLibraryPutsIt(t *testing.T) {
	d := systemdDriver{unified: oc.IsCgroup2UnifiedMode()}
	slice := "kubepods-burstable-pod123.slice"
	cgroup, err := d.Path(slice, testID)
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.manager(slice, testID)
	if err != nil {
		t.Skipf("no cgroup hierarchies for the library here: %v", err)
	}
	paths := m.GetPaths()
	if len(paths) == 0 {
		t.Fatal("the manager uses no hierarchy")
	}
	for controller, p := range paths {
		if !strings.HasSuffix(p, cgroup) {
			t.Errorf("the library puts the scope at %s for %q, not at %s", p, controller, cgroup)
		}
	}
	want := "memory"
	if d.unified {
		want = ""
	}
	if _, ok := paths[want]; !ok {
		t.Errorf("no %q hierarchy among %v", want, paths)
	}
}

func TestSystemdScopeOf(t *testing.T) {
	d := systemdDriver{}
	cgroup, err := d.Path("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9.slice", testID)
	if err != nil {
		t.Fatal(err)
	}
	slice, gotID, err := d.scopeOf(cgroup)
	if err != nil || slice != "kubepods-besteffort-pod9.slice" || gotID != testID {
		t.Fatalf("scopeOf(%q) = %q, %q, %v", cgroup, slice, gotID, err)
	}
	for _, foreign := range []string{
		"/kubepods/besteffort/pod9/" + testID, // placed by the cgroupfs driver
		"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9.slice/cri-containerd-" + testID + ".scope",
		"/kubepods.slice/kubepods-pod9.slice/cocoon-cri-" + testID + ".scope/",
		"/system.slice/kubepods-pod9.slice/cocoon-cri-" + testID + ".scope",
	} {
		if _, _, err := d.scopeOf(foreign); err == nil {
			t.Errorf("scopeOf(%q) succeeded", foreign)
		}
		// Refused before any D-Bus call, which this machine could not answer.
		if err := d.Remove(context.Background(), foreign, foreign); err == nil {
			t.Errorf("Remove(%q) succeeded", foreign)
		}
	}
	if err := d.Remove(context.Background(), "", ""); err != nil {
		t.Errorf("Remove with no cgroup: %v", err)
	}
}

// TestSystemdPlaceRefusesBeforeDBus: what Place checks itself fails before systemd is asked.
func TestSystemdPlaceRefusesBeforeDBus(t *testing.T) {
	d := systemdDriver{}
	if _, _, err := d.Place("/kubepods/pod1", testID, []int{1}); err == nil {
		t.Error("Place under a cgroupfs parent succeeded")
	}
	if _, _, err := d.Place("kubepods-pod1.slice", testID, nil); err == nil || !strings.Contains(err.Error(), "without a process") {
		t.Errorf("Place with no process: %v", err)
	}
}

// TestJoin moves a process tree into a unit's cgroups, given as the managers name them (by
// controller, several naming one hierarchy), in this host's hierarchies; a hierarchy the unit has
// no cgroup in is left alone.
func TestJoin(t *testing.T) {
	h := realHost(t)
	cgroup := testParent(t, h) + "/cocoon-cri-" + testID + ".scope"
	paths := map[string]string{}
	for _, hier := range h.Hierarchies {
		if _, err := hier.create(cgroup); err != nil {
			t.Fatal(err)
		}
		d, _ := hier.dir(cgroup)
		for _, c := range append(hier.Controllers, "") {
			paths[c] = d
		}
	}
	unmade := filepath.Join(t.TempDir(), "net_prio", cgroup)
	paths["net_prio"] = unmade
	_, pids := startTree(t)

	if err := join(paths, pids); err != nil {
		t.Fatal(err)
	}
	procs, err := procsOf(h, cgroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, hier := range h.Hierarchies {
		if got := slices.Sorted(slices.Values(procs[hier.Mount])); !slices.Equal(got, slices.Sorted(slices.Values(pids))) {
			t.Errorf("%s holds %v, want %v", hier, got, pids)
		}
	}
	if _, err := os.Stat(unmade); !os.IsNotExist(err) {
		t.Errorf("join made the unit's cgroup in a hierarchy it is not in: %v", err)
	}

	// A directory that is not a cgroup is not written to.
	notCgroup := t.TempDir()
	err = join(map[string]string{"memory": notCgroup}, []int{pids[0]})
	if err == nil || !strings.Contains(err.Error(), notCgroup) {
		t.Fatalf("join into a directory that is no cgroup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(notCgroup, "cgroup.procs")); !os.IsNotExist(err) {
		t.Fatalf("join made cgroup.procs: %v", err)
	}
	// Only the hypervisor: systemd placed it, nothing else to do.
	if err := join(map[string]string{"memory": notCgroup}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSystemdPlaceWithoutSystemd goes as far as this machine allows: with nothing answering on
// D-Bus the scope cannot start, Place says so and returns the cgroup for the caller's cleanup,
// and Remove of a unit that never existed succeeds.
func TestSystemdPlaceWithoutSystemd(t *testing.T) {
	if systemd.IsRunningSystemd() {
		t.Skip("systemd runs here: Place would start a real scope")
	}
	d := systemdDriver{unified: oc.IsCgroup2UnifiedMode()}
	slice := "kubepods-pod1.slice"
	if _, err := d.manager(slice, testID); err != nil {
		t.Skipf("no cgroup hierarchies for the library here: %v", err)
	}
	want, _ := d.Path(slice, testID)
	cgroup, created, err := d.Place(slice, testID, []int{os.Getpid()})
	if err == nil {
		t.Fatal("Place started a scope with no systemd")
	}
	if !strings.Contains(err.Error(), "cocoon-cri-"+testID+".scope") || !strings.Contains(err.Error(), "dbus") {
		t.Errorf("Place error %q names neither the scope nor D-Bus", err)
	}
	if cgroup != want || created != want {
		t.Errorf("Place returned %q, %q for cleanup; want %q", cgroup, created, want)
	}
	if err := d.Remove(context.Background(), cgroup, created); err != nil {
		t.Errorf("Remove of a scope that never started: %v", err)
	}
}

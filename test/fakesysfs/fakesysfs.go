// Package fakesysfs lays out the part of a node's sysfs and /dev/vfio that VFIO passthrough
// reads, in a test's directory: this machine has no IOMMU and no device to give away.
package fakesysfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// AddPCIDevice makes PCI device bdf, bound to driver (none when empty), a member of IOMMU group
// under the sysfs root: the links and directories the kernel makes.
func AddPCIDevice(t testing.TB, root, group, bdf, driver string) {
	t.Helper()
	dev := filepath.Join(root, "bus", "pci", "devices", bdf)
	groupDevs := filepath.Join(root, "kernel", "iommu_groups", group, "devices")
	for _, dir := range []string{dev, groupDevs, filepath.Join(root, "bus", "pci", "drivers")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		filepath.Join(groupDevs, bdf):     "../../../../bus/pci/devices/" + bdf,
		filepath.Join(dev, "iommu_group"): "../../../../kernel/iommu_groups/" + group,
	}
	if driver != "" {
		if err := os.MkdirAll(filepath.Join(root, "bus", "pci", "drivers", driver), 0o755); err != nil {
			t.Fatal(err)
		}
		links[filepath.Join(dev, "driver")] = "../../drivers/" + driver
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
}

// GroupNode makes <dir>/vfio/<name> a character device node, as /dev/vfio/<group> is, and
// returns its path. Its numbers are /dev/null's: nothing ever opens it.
func GroupNode(t testing.TB, dir, name string) string {
	t.Helper()
	testproc.RequireRoot(t, "a character device node")
	if err := os.MkdirAll(filepath.Join(dir, "vfio"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vfio", name)
	if err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	return path
}

package guest

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// SysfsEnv names the directory the simulator reads as the host's /sys when a PCI device is passed
// through: this machine has no IOMMU, so tests lay out the devices in a tree of their own
// (test/fakesysfs). cocoon and cloud-hypervisor read /sys itself.
const SysfsEnv = "COCOON_SIM_SYSFS_DIR"

// SysfsPCIPrefix is where cocoon names every PCI device it passes through.
const SysfsPCIPrefix = "/sys/bus/pci/devices/"

// HostSysfsPath maps a /sys path to the directory the simulator reads for it.
func HostSysfsPath(p string) string {
	dir := os.Getenv(SysfsEnv)
	rest, ok := strings.CutPrefix(p, "/sys/")
	if dir == "" || !ok {
		return p
	}
	return filepath.Join(dir, rest)
}

// Device is one VFIO PCI device as Cloud Hypervisor's configuration lists it.
type Device struct {
	ID   string `json:"id,omitempty"`
	Path string `json:"path"`
}

// vfioDriver is the host driver a device must be bound to for a hypervisor to open its group.
const vfioDriver = "vfio-pci"

// handleAddDevice passes a host PCI device through, as cloud-hypervisor does with VFIO: the
// device's IOMMU group is opened, which fails while the group is not viable (a member bound to a
// host driver) or another process holds it. The simulated guest sees no PCI bus, so the device
// reaches no guest; the configuration lists it.
func (v *vmm) handleAddDevice(w http.ResponseWriter, r *http.Request) {
	var dev Device
	if !decodeDevice(w, r, "vm.add-device", &dev) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.admitDevice(w, "vm.add-device", &dev.ID, "_vfio", func() int { return len(v.cfg.Devices) }) {
		return
	}
	group, err := v.openGroup(dev.Path)
	if err != nil {
		apiError(w, "vm.add-device: VFIO: %v", err)
		return
	}
	if v.vfioGroups == nil {
		v.vfioGroups = map[string]*os.File{}
	}
	v.vfioGroups[group.name] = group.file
	v.cfg.Devices = append(v.cfg.Devices, dev)
	writeJSON(w, map[string]string{"id": dev.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 0x10+len(v.cfg.Disks)+len(v.cfg.Nets)+len(v.cfg.Devices))})
}

type vfioGroup struct {
	name string
	file *os.File
}

// openGroup opens the IOMMU group of the device at path, or finds it open already: one process
// holds a group, for all its devices. The caller holds v.mu.
func (v *vmm) openGroup(path string) (vfioGroup, error) {
	dev := HostSysfsPath(path)
	link, err := os.Readlink(filepath.Join(dev, "iommu_group"))
	if err != nil {
		return vfioGroup{}, fmt.Errorf("device %s has no IOMMU group: %w", path, err)
	}
	name := filepath.Base(link)
	if f := v.vfioGroups[name]; f != nil {
		return vfioGroup{name, f}, nil
	}
	groupDir := HostSysfsPath(filepath.Join("/sys/kernel/iommu_groups", name))
	members, err := os.ReadDir(filepath.Join(groupDir, "devices"))
	if err != nil {
		return vfioGroup{}, fmt.Errorf("group %s: %w", name, err)
	}
	for _, m := range members {
		if driver := boundDriver(m.Name()); driver != "" && driver != vfioDriver {
			return vfioGroup{}, fmt.Errorf("group %s is not viable: device %s is bound to %s", name, m.Name(), driver)
		}
	}
	if driver := boundDriver(filepath.Base(path)); driver != vfioDriver {
		return vfioGroup{}, fmt.Errorf("device %s is not bound to %s (driver %q)", filepath.Base(path), vfioDriver, driver)
	}
	// A group's character device opens once: the next process gets EBUSY until the holder closes
	// it or exits. A lock on the group's sysfs directory plays that.
	f, err := os.Open(groupDir)
	if err != nil {
		return vfioGroup{}, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			err = unix.EBUSY
		}
		return vfioGroup{}, fmt.Errorf("open /dev/vfio/%s: %w", name, err)
	}
	return vfioGroup{name, f}, nil
}

// removeVFIODevice takes a passed-through device away, and closes its group once no device of the
// group is left. The caller holds v.mu.
func (v *vmm) removeVFIODevice(id string) {
	i := slices.IndexFunc(v.cfg.Devices, func(d Device) bool { return d.ID == id })
	group := groupOf(v.cfg.Devices[i].Path)
	v.cfg.Devices = slices.Delete(v.cfg.Devices, i, i+1)
	if !slices.ContainsFunc(v.cfg.Devices, func(d Device) bool { return groupOf(d.Path) == group }) {
		if f := v.vfioGroups[group]; f != nil {
			f.Close()
			delete(v.vfioGroups, group)
		}
	}
}

// closeVFIOGroups lets go of every group, as a hypervisor that stops does. The caller holds v.mu.
func (v *vmm) closeVFIOGroups() {
	for name, f := range v.vfioGroups {
		f.Close()
		delete(v.vfioGroups, name)
	}
	if v.cfg != nil {
		v.cfg.Devices = nil
	}
}

// boundDriver is the name of the host driver bound to a PCI device, empty when none.
func boundDriver(bdf string) string {
	link, err := os.Readlink(HostSysfsPath(SysfsPCIPrefix + bdf + "/driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(link)
}

func groupOf(path string) string {
	link, _ := os.Readlink(filepath.Join(HostSysfsPath(path), "iommu_group"))
	return filepath.Base(link)
}

package vmruntime

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
	"github.com/cocoonstack/cocoon-cri/pkg/vfio"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A host device node means nothing in a guest, which has its own kernel, so each CRI device is
// given to the VM as what it is underneath:
//   - a block device (a block PersistentVolume's, which the kubelet hands over as a CRI device) or
//     a raw disk file becomes a disk: cocoon's `vm disk attach` hot-adds it to the running VM with
//     the serial blk<n>, and the guest's /dev/disk/by-id/virtio-blk<n> is linked at the container
//     path;
//   - a VFIO group (/dev/vfio/<group>, how device plugins hand out GPUs and NIC functions) becomes
//     its PCI devices, each hot-added with `vm device attach`: the guest's own driver takes them
//     and makes its own device nodes;
//   - /dev/vfio/vfio, which a process needs beside its groups, needs nothing: the hypervisor
//     opens its own.
//
// docs/design.md, Devices.

// deviceKind is what a container's device becomes in its VM.
type deviceKind int

const (
	deviceDisk deviceKind = iota
	devicePCI
	deviceNone // /dev/vfio/vfio
)

// vmDevice is one CRI device, resolved against the node.
type vmDevice struct {
	kind  deviceKind
	group string   // the VFIO group of a devicePCI
	pci   []string // its PCI addresses
}

// validateDevices refuses what no attach can honour, before anything is made.
func validateDevices(devs []*runtimeapi.Device) error {
	seen := map[string]bool{}
	for _, d := range devs {
		target, source := d.GetContainerPath(), d.GetHostPath()
		switch {
		case !path.IsAbs(target) || strings.IndexByte(target, 0) >= 0:
			return invalid("devices: container_path %q must be an absolute path in the guest", target)
		case !filepath.IsAbs(source) || strings.IndexByte(source, 0) >= 0:
			return invalid("devices: host_path %q of %s must be an absolute path on the node", source, target)
		case strings.Trim(d.GetPermissions(), "rwm") != "":
			return invalid("devices: permissions %q of %s: only r, w and m", d.GetPermissions(), target)
		case seen[path.Clean(target)]:
			return invalid("devices: %s is given twice", target)
		}
		seen[path.Clean(target)] = true
	}
	return nil
}

// hostDeviceKind says what the device at hostPath becomes in a VM, and its VFIO group if it is
// one, from its type and name. Its errors are the user's: they say what to change.
func hostDeviceKind(hostPath string) (deviceKind, string, error) {
	info, err := os.Stat(hostPath)
	if err != nil {
		return 0, "", err
	}
	mode := info.Mode()
	if mode.IsRegular() || mode&fs.ModeDevice != 0 && mode&fs.ModeCharDevice == 0 {
		return deviceDisk, "", nil
	}
	node, group := vfio.Classify(hostPath, mode)
	switch node {
	case vfio.Group:
		return devicePCI, group, nil
	case vfio.Container:
		return deviceNone, "", nil
	case vfio.NoIOMMUGroup:
		return 0, "", fmt.Errorf("%s is a no-IOMMU VFIO group: a hypervisor passes through only devices behind an IOMMU; "+
			"turn the IOMMU on (intel_iommu=on or amd_iommu=on) and bind the device to %s again", hostPath, vfio.Driver)
	}
	return 0, "", fmt.Errorf("%s is neither a block device, a disk file nor a VFIO group: a VM takes block devices as disks "+
		"and PCI devices through VFIO; other character devices (/dev/fuse, /dev/nvidia0) belong to the host's kernel, "+
		"so run this container with another runtime class or give the VM the device's VFIO group", hostPath)
}

// resolveDevice is hostDeviceKind with the PCI devices of a VFIO group, read from the node's
// sysfs: each must be bound to vfio-pci.
func (s *Runtime) resolveDevice(hostPath string) (vmDevice, error) {
	kind, group, err := hostDeviceKind(hostPath)
	if err != nil || kind != devicePCI {
		return vmDevice{kind: kind}, err
	}
	pcis, err := s.cfg.Sysfs.GroupDevices(group)
	if err != nil {
		return vmDevice{}, fmt.Errorf("%s: %w", hostPath, err)
	}
	dev := vmDevice{kind: devicePCI, group: group}
	for _, p := range pcis {
		if p.Driver != vfio.Driver {
			return vmDevice{}, fmt.Errorf("PCI device %s of IOMMU group %s (%s) is bound to %q, not %s: every device of a group "+
				"goes to the VM, so bind each to %s first (driverctl set-override %s %s)",
				p.BDF, group, hostPath, p.Driver, vfio.Driver, vfio.Driver, p.BDF, vfio.Driver)
		}
		dev.pci = append(dev.pci, p.BDF)
	}
	return dev, nil
}

// checkDevicesCanAttach refuses devices this VM cannot take: what is neither a disk nor a VFIO
// group, a PCI device not bound to vfio-pci, a cocoon without the attach a device needs, a
// Firecracker VM.
func (s *Runtime) checkDevicesCanAttach(ctx context.Context, devs []*runtimeapi.Device, backend string) error {
	if len(devs) == 0 {
		return nil
	}
	var disk, pci string // the first device of each kind, for the messages
	groups := map[string]string{}
	for _, d := range devs {
		dev, err := s.resolveDevice(d.GetHostPath())
		if err != nil {
			return invalid("devices: %s: %v", d.GetContainerPath(), err)
		}
		switch {
		case dev.kind == deviceDisk && disk == "":
			disk = d.GetHostPath()
		case dev.kind == devicePCI && groups[dev.group] != "":
			return invalid("devices: %s and %s are the same IOMMU group %s: a group goes to a VM once", groups[dev.group], d.GetHostPath(), dev.group)
		case dev.kind == devicePCI:
			groups[dev.group] = d.GetHostPath()
			if pci == "" {
				pci = d.GetHostPath()
			}
		}
	}
	if disk == "" && pci == "" {
		return nil
	}
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("learn whether this cocoon can attach devices: %w", err)
	}
	switch {
	case disk != "" && !caps.DiskAttach:
		return invalid("devices: %s cannot be given to the VM: this cocoon (%s) has no vm disk attach; upgrade cocoon to v0.5, "+
			"or run this container with another runtime class", disk, caps.Version)
	case pci != "" && !caps.DeviceAttach:
		return invalid("devices: %s cannot be given to the VM: this cocoon (%s) has no vm device attach; upgrade cocoon to v0.5, "+
			"or run this container with another runtime class", pci, caps.Version)
	case backend == cocoon.HypervisorFirecracker:
		return invalid("devices: %s cannot be given to a Firecracker VM: cocoon hot-attaches disks and PCI devices to cloud-hypervisor VMs; "+
			"drop the vm.cocoonstack.io/backend annotation or use a cloud-hypervisor snapshot", cmp.Or(disk, pci))
	}
	return nil
}

// deviceSerial is the disk name and guest serial of the container's i-th device.
func deviceSerial(i int) string { return fmt.Sprintf("blk%d", i) }

// pciDeviceID is the VM's device ID for a passed-through PCI device: CH's IDs take no colons.
func pciDeviceID(bdf string) string { return "vfio-" + strings.ReplaceAll(bdf, ":", "-") }

// attachDevices hot-adds the container's block devices and the PCI devices of its VFIO groups to
// its running VM. They go with the VM: a stop ends the hypervisor, which lets go of them.
func (s *Runtime) attachDevices(ctx context.Context, sb *store.Sandbox, c *store.Container, vmID string) error {
	cc := s.cocoonFor(sb)
	for i, d := range c.Config.Msg.GetDevices() {
		dev, err := s.resolveDevice(d.GetHostPath())
		if err != nil {
			return fmt.Errorf("attach device %s: %w", d.GetHostPath(), err)
		}
		switch dev.kind {
		case deviceDisk:
			readonly := !strings.Contains(d.GetPermissions(), "w")
			if err := cc.VMDiskAttach(ctx, vmID, d.GetHostPath(), deviceSerial(i), readonly); err != nil {
				return fmt.Errorf("attach device %s: %w", d.GetHostPath(), err)
			}
		case devicePCI:
			for _, bdf := range dev.pci {
				if err := cc.VMDeviceAttach(ctx, vmID, bdf, pciDeviceID(bdf)); err != nil {
					return fmt.Errorf("attach PCI device %s of %s: %w", bdf, d.GetHostPath(), err)
				}
			}
		}
	}
	return nil
}

// guestDeviceWait bounds, in tenths of a second, the guest's wait for udev's by-id link.
const guestDeviceWait = 100

// linkDevices links each attached disk at its container path in the guest, once udev has named
// it (a minimal image may need a nudge: udevadm trigger). PCI devices need no link: the guest's
// driver makes its own nodes.
func (s *Runtime) linkDevices(ctx context.Context, sb *store.Sandbox, c *store.Container) error {
	var b strings.Builder
	for i, d := range c.Config.Msg.GetDevices() {
		if kind, _, err := hostDeviceKind(d.GetHostPath()); err == nil && kind != deviceDisk {
			continue
		}
		link := "/dev/disk/by-id/virtio-" + deviceSerial(i)
		target := path.Clean(d.GetContainerPath())
		fmt.Fprintf(&b, "i=0; while [ ! -e %[1]s ]; do [ $i -lt %[2]d ] || { echo \"no %[1]s in the guest\" >&2; exit 1; }; "+
			"udevadm trigger --action=add --subsystem-match=block >/dev/null 2>&1 || true; sleep 0.1; i=$((i+1)); done\n",
			link, guestDeviceWait)
		fmt.Fprintf(&b, "mkdir -p %s\nln -sfn %s %s\n", streaming.ShellQuote([]string{path.Dir(target)}), link,
			streaming.ShellQuote([]string{target}))
	}
	if b.Len() == 0 {
		return nil
	}
	out := &syncio.Tail{Max: guestOutputTail}
	code, err := s.guest.run(ctx, sb, c, systemCommand("/bin/sh", "-c", "set -e\n"+b.String()), streaming.ExecIO{Stdout: out, Stderr: out})
	switch {
	case err != nil:
		return fmt.Errorf("devices did not reach the guest: %w", err)
	case code != 0:
		return fmt.Errorf("devices did not reach the guest: the guest's command exited with %d: %s", code, strings.TrimSpace(out.String()))
	}
	return nil
}

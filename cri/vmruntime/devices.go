package vmruntime

import (
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
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// A host device node means nothing in a guest, which has its own kernel. A block device (a block
// PersistentVolume's, which the kubelet hands over as a CRI device) or a raw disk file is given to
// the VM as a disk instead: cocoon's `vm disk attach` hot-adds it to the running VM with the
// serial blk<n>, and the guest's /dev/disk/by-id/virtio-blk<n> is linked at the container path.
// docs/design.md, Block devices.

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

// checkDevicesCanAttach refuses devices this VM cannot take: anything but a block device or a
// regular file, a cocoon without vm disk attach, a Firecracker VM.
func (s *Server) checkDevicesCanAttach(ctx context.Context, devs []*runtimeapi.Device, backend string) error {
	if len(devs) == 0 {
		return nil
	}
	for _, d := range devs {
		info, err := os.Stat(d.GetHostPath())
		if err != nil {
			return invalid("devices: %s: %v", d.GetContainerPath(), err)
		}
		if info.Mode().IsRegular() || info.Mode()&fs.ModeDevice != 0 && info.Mode()&fs.ModeCharDevice == 0 {
			continue
		}
		return invalid("devices: %s is not a block device or a disk file: a VM takes block devices as disks "+
			"(block volumes); character devices and PCI devices (GPUs, VFIO) are not passed into guests yet; "+
			"run this container with another runtime class", d.GetHostPath())
	}
	caps, err := s.cocoon.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("learn whether this cocoon has vm disk attach: %w", err)
	}
	switch {
	case !caps.DiskAttach:
		return invalid("devices: %s cannot be given to the VM: this cocoon (%s) has no vm disk attach; upgrade cocoon to v0.5, "+
			"or run this container with another runtime class", devs[0].GetHostPath(), caps.Version)
	case backend == cocoon.HypervisorFirecracker:
		return invalid("devices: %s cannot be given to a Firecracker VM: cocoon hot-attaches disks to cloud-hypervisor VMs; "+
			"drop the vm.cocoonstack.io/backend annotation or use a cloud-hypervisor snapshot", devs[0].GetHostPath())
	}
	return nil
}

// deviceSerial is the disk name and guest serial of the container's i-th device.
func deviceSerial(i int) string { return fmt.Sprintf("blk%d", i) }

// attachDevices hot-adds the container's block devices to its running VM.
func (s *Server) attachDevices(ctx context.Context, sb *store.Sandbox, c *store.Container, vmID string) error {
	for i, d := range c.Config.Msg.GetDevices() {
		readonly := !strings.Contains(d.GetPermissions(), "w")
		if err := s.cocoonFor(sb).VMDiskAttach(ctx, vmID, d.GetHostPath(), deviceSerial(i), readonly); err != nil {
			return fmt.Errorf("attach device %s: %w", d.GetHostPath(), err)
		}
	}
	return nil
}

// guestDeviceWait bounds, in tenths of a second, the guest's wait for udev's by-id link.
const guestDeviceWait = 100

// linkDevices links each attached disk at its container path in the guest, once udev has named
// it (a minimal image may need a nudge: udevadm trigger).
func (s *Server) linkDevices(ctx context.Context, sb *store.Sandbox, c *store.Container) error {
	devs := c.Config.Msg.GetDevices()
	if len(devs) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("set -e\n")
	for i, d := range devs {
		link := "/dev/disk/by-id/virtio-" + deviceSerial(i)
		target := path.Clean(d.GetContainerPath())
		fmt.Fprintf(&b, "i=0; while [ ! -e %[1]s ]; do [ $i -lt %[2]d ] || { echo \"no %[1]s in the guest\" >&2; exit 1; }; "+
			"udevadm trigger --action=add --subsystem-match=block >/dev/null 2>&1 || true; sleep 0.1; i=$((i+1)); done\n",
			link, guestDeviceWait)
		fmt.Fprintf(&b, "mkdir -p %s\nln -sfn %s %s\n", streaming.ShellQuote([]string{path.Dir(target)}), link,
			streaming.ShellQuote([]string{target}))
	}
	out := &syncio.Tail{Max: guestOutputTail}
	code, err := s.guestExec(ctx, sb, c, systemCommand("/bin/sh", "-c", b.String()), streaming.ExecIO{Stdout: out, Stderr: out})
	switch {
	case err != nil:
		return fmt.Errorf("devices did not reach the guest: %w", err)
	case code != 0:
		return fmt.Errorf("devices did not reach the guest: the guest's command exited with %d: %s", code, strings.TrimSpace(out.String()))
	}
	return nil
}

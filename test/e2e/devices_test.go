package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/fakesysfs"
)

// TestBlockDevicesReachTheGuest: a container's block devices (a block volume's device, or a raw
// disk file) are hot-attached to its VM with cocoon's vm disk attach and linked at their container
// paths: the guest reads and writes the node's file, a read-only device refuses writes, and the
// file outlives the pod. What cannot be attached is refused at create.
func TestBlockDevicesReachTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	dir := t.TempDir()
	disk, roDisk := filepath.Join(dir, "pv.raw"), filepath.Join(dir, "ro.raw")
	data := make([]byte, 4<<20)
	copy(data, "block-data")
	for _, f := range []string{disk, roDisk} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	podID, ctrID, _ := n.runningPodWith("blocks", snapRef, func(cfg *runtimeapi.ContainerConfig) {
		cfg.Command = []string{"sh", "-c", "head -c 10 /dev/xvda; echo; exec sleep 600"}
		cfg.Devices = []*runtimeapi.Device{
			{ContainerPath: "/dev/xvda", HostPath: disk, Permissions: "rwm"},
			{ContainerPath: "/dev/block/ro", HostPath: roDisk, Permissions: "r"},
		}
	})
	// The main command runs once the devices are linked.
	n.waitLog(ctrID, "block-data")
	n.mustCrictl("exec", ctrID, "sh", "-c", "printf written | dd of=/dev/xvda bs=1 seek=100 conv=notrunc 2>/dev/null")
	if got, _ := os.ReadFile(disk); !bytes.Equal(got[100:107], []byte("written")) {
		t.Fatalf("the guest's write did not reach the node's disk: %q", got[96:110])
	}
	if got := n.mustCrictl("exec", ctrID, "head", "-c", "10", "/dev/block/ro"); got != "block-data" {
		t.Fatalf("the read-only device reads %q", got)
	}
	if out, err := n.crictl("exec", ctrID, "sh", "-c", "printf x | dd of=/dev/block/ro conv=notrunc"); err == nil {
		t.Fatalf("the guest wrote to a read-only device: %q", out)
	}
	n.mustCrictl("stopp", podID)
	n.mustCrictl("rmp", podID)
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("the disk file went with the pod: %v", err)
	}

	// A Firecracker VM, and a cocoon without vm disk attach, cannot take one.
	n.ImportImage("e2e/fc:v1", n.SnapshotImage("fc", fcSnapshot(guest.Spec{})))
	cfg := containerConfig("dev", "e2e/fc:v1")
	cfg.Devices = []*runtimeapi.Device{{ContainerPath: "/dev/xvda", HostPath: disk, Permissions: "rw"}}
	if msg := n.createRefused("fc", cfg); !strings.Contains(msg, "Firecracker") {
		t.Fatalf("a device for a Firecracker VM: %s", msg)
	}
	cfg.Image.Image = snapRef
	msg := oldCocoonNode(t).createRefused("old", cfg)
	if !strings.Contains(msg, "no vm disk attach") || !strings.Contains(msg, disk) {
		t.Fatalf("a device on cocoon v0.3.8: %s", msg)
	}
}

// TestVFIOGroupsReachTheVM: a container's VFIO group (/dev/vfio/<group>, as a device plugin hands
// out a GPU) becomes the group's PCI devices, passed through to its VM with cocoon's vm device
// attach; /dev/vfio/vfio needs nothing. The devices go with the container's VM: while one pod
// holds the group another cannot start with it, and once that container stops it can. A group
// whose devices are not all on vfio-pci, one sysfs does not know, and a VM or a cocoon that cannot
// take PCI devices are refused at create.
func TestVFIOGroupsReachTheVM(t *testing.T) {
	t.Parallel()
	sys, dev := t.TempDir(), t.TempDir()
	fakesysfs.AddPCIDevice(t, sys, "7", "0000:01:00.0", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "7", "0000:01:00.1", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "8", "0000:02:00.0", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "8", "0000:02:00.1", "snd_hda_intel")
	group7, group8, group9 := fakesysfs.GroupNode(t, dev, "7"), fakesysfs.GroupNode(t, dev, "8"), fakesysfs.GroupNode(t, dev, "9")
	container, noIOMMU := fakesysfs.GroupNode(t, dev, "vfio"), fakesysfs.GroupNode(t, dev, "noiommu-3")
	gpu := func(cfg *runtimeapi.ContainerConfig) {
		cfg.Command = []string{"sleep", "600"}
		cfg.Devices = []*runtimeapi.Device{
			{ContainerPath: "/dev/vfio/vfio", HostPath: container, Permissions: "rw"},
			{ContainerPath: "/dev/vfio/7", HostPath: group7, Permissions: "rw"},
		}
	}

	n := newNodeWithEnv(t, []string{cocoonsim.SysfsEnv + "=" + sys}, "--sysfs-dir", sys)
	n.withSnapshot()
	podA, ctrA, _ := n.runningPodWith("gpu-a", snapRef, gpu)
	if got := n.passedThrough(ctrA); got != "vfio-0000-01-00.0=0000:01:00.0 vfio-0000-01-00.1=0000:01:00.1" {
		t.Fatalf("the VM's passed-through devices: %q", got)
	}

	// The group is the first VM's while it runs: the second's start fails and leaves no VM.
	podFile := n.configFile("gpu-b-pod.json", n.podConfig("gpu-b", "uid-gpu-b"))
	podB := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("app", snapRef)
	gpu(cfg)
	ctrFile := n.configFile("gpu-b-ctr.json", cfg)
	busy := n.mustCrictl("create", "--no-pull", podB, ctrFile, podFile)
	if _, err := n.crictl("start", busy); err == nil || !strings.Contains(err.Error(), "code = FailedPrecondition") ||
		!strings.Contains(err.Error(), "device or resource busy") {
		t.Fatalf("a second VM took a held group: %v", err)
	}
	if msg := field(n.inspect("inspect", busy), "status", "message"); !strings.Contains(fmt.Sprint(msg), "attach PCI device 0000:01:00.0 of "+group7) {
		t.Fatalf("the failed start's message: %v", msg)
	}
	// Stopping the holder lets go of the group: the kubelet's next attempt starts.
	n.mustCrictl("stop", ctrA)
	cfg.Metadata.Attempt = 1
	ctrB := n.mustCrictl("create", "--no-pull", podB, n.configFile("gpu-b-ctr1.json", cfg), podFile)
	n.mustCrictl("start", ctrB)
	if got := n.passedThrough(ctrB); !strings.Contains(got, "=0000:01:00.0") {
		t.Fatalf("the second VM's passed-through devices after the first stopped: %q", got)
	}
	for _, p := range []string{podA, podB} {
		n.mustCrictl("stopp", p)
		n.mustCrictl("rmp", p)
	}

	for _, tc := range []struct {
		name, hostPath, want string
	}{
		{"viable", group8, "PCI device 0000:02:00.1 of IOMMU group 8 (" + group8 + ") is bound to"},
		{"unknown", group9, "no such IOMMU group 9"},
		{"noiommu", noIOMMU, "is a no-IOMMU VFIO group"},
		{"chardev", "/dev/null", "is neither a block device, a disk file nor a VFIO group"},
	} {
		cfg := containerConfig("app", snapRef)
		cfg.Devices = []*runtimeapi.Device{{ContainerPath: "/dev/vfio/x", HostPath: tc.hostPath, Permissions: "rw"}}
		if msg := n.createRefused(tc.name, cfg); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %s", tc.name, msg)
		}
	}
	n.ImportImage("e2e/fc:v1", n.SnapshotImage("fc", fcSnapshot(guest.Spec{})))
	cfg = containerConfig("dev", "e2e/fc:v1")
	gpu(cfg)
	if msg := n.createRefused("fc", cfg); !strings.Contains(msg, "Firecracker") || !strings.Contains(msg, group7) {
		t.Fatalf("a VFIO group for a Firecracker VM: %s", msg)
	}
	old := newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=0.3.8"}, "--sysfs-dir", sys)
	old.withSnapshot()
	cfg.Image.Image, cfg.Command = snapRef, nil // v0.3.8 runs no command without a guest login
	if msg := old.createRefused("old", cfg); !strings.Contains(msg, "no vm device attach") || !strings.Contains(msg, group7) {
		t.Fatalf("a VFIO group on cocoon v0.3.8: %s", msg)
	}
}

// passedThrough is what `cocoon vm inspect` lists under attached_devices.devices for the
// container's VM, as "id=bdf ...".
func (n *node) passedThrough(ctrID string) string {
	n.t.Helper()
	name := fmt.Sprint(field(n.inspect("inspect", ctrID), "info", "vm", "name"))
	out, err := n.cocoon("vm", "inspect", name)
	if err != nil {
		n.t.Fatal(err)
	}
	var shown struct {
		AttachedDevices struct {
			Devices []struct{ ID, BDF string } `json:"devices"`
		} `json:"attached_devices"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		n.t.Fatal(err)
	}
	var pairs []string
	for _, d := range shown.AttachedDevices.Devices {
		pairs = append(pairs, d.ID+"="+d.BDF)
	}
	return strings.Join(pairs, " ")
}

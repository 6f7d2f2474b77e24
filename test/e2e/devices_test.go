package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// TestBlockDevicesReachTheGuest: a container's block devices (a block volume's device, or a raw
// disk file) are hot-attached to its VM with cocoon's vm disk attach and linked at their container
// paths: the guest reads and writes the node's file, a read-only device refuses writes, and the
// file outlives the pod. What cannot be attached is refused at create.
func TestBlockDevicesReachTheGuest(t *testing.T) {
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
	n.importImage("e2e/fc:v1", n.snapshotImage("fc", fcSnapshot(guest.Spec{})))
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

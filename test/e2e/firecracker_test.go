package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// fcSnapshot is a Firecracker snapshot of a VM with one NIC.
func fcSnapshot(spec guest.Spec) testimage.SnapshotOptions {
	return testimage.SnapshotOptions{Hypervisor: cocoon.HypervisorFirecracker, NICs: 1, Guest: spec}
}

// TestFirecrackerSnapshotPod: a pod from a Firecracker snapshot runs under Firecracker. On v0.5
// its guest, which woke with the snapshot's MAC, is set up through cocoon-agent and answers at the
// pod IP with the pod interface's MAC (v0.3.8 has no way into a clone's guest: it keeps what the
// snapshot had, docs/networking.md). On both, the console (cocoon's relay on console.sock) is the
// container's log, takes attach input and comes back after a cocoon-cri restart; a stop is the
// guest's own clean power-off (Ctrl-Alt-Del), and removing the pod leaves nothing.
func TestFirecrackerSnapshotPod(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			n := newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=" + version})
			// v0.3.8 took Firecracker snapshots without a vsock device, and cannot move one.
			snap := fcSnapshot(guest.Spec{})
			snap.NoVsock = version == "0.3.8"
			n.ImportImage(snapRef, n.SnapshotImage("fc", snap))
			checkFirecrackerPod(t, n, version == "0.5.1")
		})
	}
}

// checkFirecrackerNetwork: guest set-up gave the guest's NIC the pod's MAC and address.
func checkFirecrackerNetwork(t *testing.T, n *node, hostname, podID, ctrID string) {
	t.Helper()
	ip := n.podIP(podID)
	if line := n.guestAnswer(fmt.Sprintf("%s:%d", ip, guestPort), hostname, ip); line != hostname+" "+ip+"\n" {
		t.Fatalf("the guest at %s answered %q, want the pod's hostname and IP", ip, line)
	}
	podMAC, _ := field(n.inspect("inspectp", podID), "info", "network", "mac").(string)
	if podMAC == "" || n.neighbourMAC(ip) != podMAC {
		t.Fatalf("the node sees %s at %q, the pod interface has %q", ip, n.neighbourMAC(ip), podMAC)
	}
	if out := n.mustCrictl("exec", ctrID, "cat", "/sys/class/net/eth0/address"); out != podMAC {
		t.Fatalf("the guest's NIC has MAC %q, want the pod's %q", out, podMAC)
	}
}

func checkFirecrackerPod(t *testing.T, n *node, agent bool) {
	podID, ctrID, _ := n.runningPod("fcweb", snapRef)

	vmName, _ := field(n.inspect("inspect", ctrID), "info", "vm", "name").(string)
	vm, err := n.vm(vmName)
	if err != nil {
		t.Fatal(err)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", vm.PID))
	if vm.Hypervisor != cocoon.HypervisorFirecracker || filepath.Base(strings.Split(string(cmdline), "\x00")[0]) != "firecracker" {
		t.Fatalf("cocoon's VM runs under %q, process %q", vm.Hypervisor, cmdline)
	}
	if agent {
		checkFirecrackerNetwork(t, n, "fcweb", podID, ctrID)
		checkFirecrackerCheckpoint(t, n, ctrID)
	}

	// Console output from before cocoon-cri connects is gone (the relay keeps nothing); what is
	// typed now is echoed and answered through it.
	n.typeAtConsole(ctrID, "typed-at-the-fc-console")
	// The relay serves one session: a restarted cocoon-cri gets it once the old one is gone.
	n.Restart()
	n.typeAtConsole(ctrID, "after-the-restart")

	n.mustCrictl("stop", "--timeout", "20", ctrID)
	st := n.inspect("inspect", ctrID)["status"].(map[string]any)
	if st["exitCode"] != 0.0 || st["reason"] != "Completed" || st["message"] != "VM powered off" {
		t.Fatalf("after stop: %v", st)
	}
	if testproc.Running(vm.PID) {
		t.Fatalf("firecracker %d still runs after the stop", vm.PID)
	}
	n.mustCrictl("rmp", "--force", podID)
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// checkFirecrackerCheckpoint: a Firecracker VM pod is checkpointed like a cloud-hypervisor one, and
// a pod of the checkpoint runs under Firecracker with its own identity.
func checkFirecrackerCheckpoint(t *testing.T, n *node, ctrID string) {
	t.Helper()
	archive := filepath.Join(n.Dir, "fc-checkpoint.tar")
	n.mustCrictl("checkpoint", "--export="+archive, ctrID)
	if md := readCheckpointMetadata(t, archive); md.Hypervisor != cocoon.HypervisorFirecracker {
		t.Fatalf("a Firecracker VM's checkpoint records hypervisor %q", md.Hypervisor)
	}
	n.ImportImage("e2e/fc-checkpoint:v1", archive)
	restoredPod, restored, _ := n.runningPod("fcrestored", "e2e/fc-checkpoint:v1")
	checkFirecrackerNetwork(t, n, "fcrestored", restoredPod, restored)
	n.mustCrictl("rmp", "--force", restoredPod)
}

// TestFirecrackerVMImagePod: an OCI VM image pod annotated for Firecracker boots under it with
// the container's size (vm create --fc), takes the pod's address from its kernel command line, and
// stops cleanly on Ctrl-Alt-Del.
func TestFirecrackerVMImagePod(t *testing.T) {
	t.Parallel()
	if !erofsHasTar() {
		t.Skip("cocoon cannot import an OCI VM image without mkfs.erofs --tar (make setup builds one)")
	}
	n := newNode(t)
	reg := n.registry(registry.Options{})
	n.pushOCIImage(reg.Target(), "e2e/vm:v1")
	ref := reg.Host + "/e2e/vm:v1"
	n.pull(ref)
	pod := n.podConfig("fcboot", "uid-fcboot")
	pod.Annotations = map[string]string{"vm.cocoonstack.io/backend": cocoon.HypervisorFirecracker}
	podFile := n.configFile("pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	cfg := containerConfig("os", ref)
	cfg.Linux.Resources.CpuQuota, cfg.Linux.Resources.MemoryLimitInBytes = 200000, 768<<20
	ctrID := n.startContainer(podID, podFile, cfg)

	vm, err := n.vm(field(n.inspect("inspect", ctrID), "info", "vm", "id").(string))
	if err != nil {
		t.Fatal(err)
	}
	if vm.Hypervisor != cocoon.HypervisorFirecracker || vm.Config.CPU != 2 || vm.Config.Memory != 768<<20 {
		t.Fatalf("cocoon VM: %+v", vm)
	}
	ip := n.podIP(podID)
	if line := n.guestAnswer(fmt.Sprintf("%s:%d", ip, guestPort), "fcboot", ip); line != "fcboot "+ip+"\n" {
		t.Fatalf("the guest at %s answered %q", ip, line)
	}
	n.mustCrictl("stop", "--timeout", "20", ctrID)
	if st := n.inspect("inspect", ctrID)["status"].(map[string]any); st["exitCode"] != 0.0 || st["message"] != "VM powered off" {
		t.Fatalf("after stop: %v", st)
	}
	n.mustCrictl("rmp", "--force", podID)
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestFirecrackerStopEscalates: a guest that ignores Ctrl-Alt-Del is stopped forcibly at the
// timeout, and the status says so.
func TestFirecrackerStopEscalates(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage(snapRef, n.SnapshotImage("fc", fcSnapshot(guest.Spec{IgnorePowerButton: true})))
	_, ctrID, _ := n.runningPod("fcstubborn", snapRef)
	pid := n.vmPID(ctrID)
	n.mustCrictl("stop", "--timeout", "2", ctrID)
	st := n.inspect("inspect", ctrID)["status"].(map[string]any)
	if st["exitCode"] != 137.0 || !strings.Contains(st["message"].(string), "did not power off within 2s") {
		t.Fatalf("after stop: %v", st)
	}
	if testproc.Running(pid) {
		t.Fatalf("firecracker %d survived the escalation", pid)
	}
}

// TestFirecrackerRefusals: what Firecracker cannot run is refused at CreateContainer with
// InvalidArgument and leaves no VM.
func TestFirecrackerRefusals(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.ImportImage("e2e/fc-nonic:v1", n.SnapshotImage("fcnonic", testimage.SnapshotOptions{Hypervisor: cocoon.HypervisorFirecracker}))
	n.withSnapshot()
	for _, tc := range []struct {
		name, image string
		annotations map[string]string
		want        string
	}{
		{"nonic", "e2e/fc-nonic:v1", nil, "Firecracker cannot add one to a clone"},
		{"mismatch", snapRef, map[string]string{"vm.cocoonstack.io/backend": cocoon.HypervisorFirecracker}, "a clone runs under its snapshot's hypervisor"},
	} {
		pod := n.podConfig(tc.name, "uid-"+tc.name)
		pod.Annotations = tc.annotations
		podFile := n.configFile(tc.name+"-pod.json", pod)
		podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
		_, err := n.crictl("create", "--no-pull", podID, n.configFile(tc.name+"-ctr.json", containerConfig("app", tc.image)), podFile)
		if err == nil || !strings.Contains(err.Error(), "InvalidArgument") || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: create: %v, want InvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	if vms := n.vms(); len(vms) != 0 {
		t.Fatalf("VMs after refused creates: %+v", vms)
	}
}

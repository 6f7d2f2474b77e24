package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/realguest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestRealGuestOnThePodNetwork boots a real Linux kernel (Debian's, under QEMU's software
// emulation) in a pod's VM and reaches it from the node at the pod IP. The path is the production
// one: cocoon-cri makes the sandbox (namespace, the cluster's CNI ADD, the attach configuration);
// cocoon makes the VM's namespace and runs the attach plugin, which hands it the pod interface;
// cocoon flushes it, creates the TAP and wires the two with tc; the kernel takes the pod address
// from ip= on its command line, built from the CNI result.
//
// The one step the test takes itself is StartContainer's `vm run`, with exactly the flags
// StartContainer passes: an OCI VM image (a kernel and initramfs) reaches cocoon-cri through a
// registry pull, and on Debian 12 cocoon cannot import one from a tar (its mkfs.erofs lacks
// --tar), so the image is put into the node's cocoon the way a pull leaves it.
func TestRealGuestOnThePodNetwork(t *testing.T) {
	t.Parallel()
	guest := realguest.ForTest(t)
	n := newNode(t)
	n.seedRealGuestImage(guest, "realguest:v1")

	pod := n.podConfig("real", "uid-real")
	podID := n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("pod.json", pod))
	ip := n.podIP(podID)
	podMAC, _ := field(n.inspect("inspectp", podID), "info", "network", "mac").(string)

	const vmName = "cri-realguest"
	vm := n.startLikeStartContainer(podID, vmName, "realguest:v1")
	// Also on failure, before the node goes; the test removes it itself on success.
	t.Cleanup(func() { _, _ = n.cocoonCommand(podID, "vm", "rm", "--force", vm.ID) })
	nic := vm.NetworkConfigs[0]
	if nic.Mac != podMAC || nic.Network == nil || nic.Network.IP != ip {
		t.Fatalf("cocoon gave the VM NIC %+v, want the pod's MAC %s and IP %s", nic, podMAC, ip)
	}

	// The simulated guest answers in the same format: make sure this one is QEMU's.
	if !hasQEMUChild(vm.PID) {
		t.Fatalf("no QEMU runs under the VM's hypervisor process %d", vm.PID)
	}
	// Booting under TCG takes seconds; dialFromNode retries until the guest answers.
	line := n.dialFromNode(fmt.Sprintf("%s:%d", ip, realguest.ServicePort))
	if fields := strings.Fields(line); len(fields) != 2 || fields[0] != vmName || fields[1] != ip {
		t.Fatalf("the real guest at %s answered %q, want %q", ip, line, vmName+" "+ip)
	}
	if out, err := nsenterNode(n, "busybox", "ping", "-c", "1", "-W", "5", ip); err != nil {
		t.Fatalf("ping %s from the node: %v\n%s", ip, err, out)
	}
	if got := n.neighbourMAC(ip); got != podMAC {
		t.Fatalf("the node sees %s at %s, want the pod interface's MAC %s", ip, got, podMAC)
	}

	// Removing the VM hands the interface back; removing the pod leaves nothing.
	n.cocoonInNode(podID, "vm", "rm", "--force", vm.ID)
	n.mustCrictl("rmp", "--force", podID)
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// seedRealGuestImage puts an OCI VM image with the real kernel and initramfs into the node's
// cocoon, as `cocoon image pull` leaves one.
func (n *node) seedRealGuestImage(g *realguest.Guest, name string) {
	n.t.Helper()
	kernel, err := os.ReadFile(g.Kernel)
	if err != nil {
		n.t.Fatal(err)
	}
	initrd, err := os.ReadFile(g.Initrd)
	if err != nil {
		n.t.Fatal(err)
	}
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{Kernel: kernel, Initrd: initrd}); err != nil {
		n.t.Fatal(err)
	}
	if _, err := cocoonsim.SeedOCIImage(context.Background(), n.RootDir, name, &layer); err != nil {
		n.t.Fatal(err)
	}
}

// startLikeStartContainer runs the `vm run` StartContainer would for a booted VM image in the pod.
func (n *node) startLikeStartContainer(podID, vmName, image string) *cocoon.VM {
	n.t.Helper()
	out := n.cocoonInNode(podID, "vm", "run", "--name", vmName, "--cpu", "1", "--memory", "512M", "--storage", "10G",
		"--nics", "1", "--network", tapmanager.CocoonNetwork, "-o", "json", image)
	var vm cocoon.VM
	if err := json.Unmarshal([]byte(out), &vm); err != nil {
		n.t.Fatalf("vm run output %q: %v", out, err)
	}
	if len(vm.NetworkConfigs) != 1 {
		n.t.Fatalf("vm run gave NICs %+v", vm.NetworkConfigs)
	}
	return &vm
}

// cocoonInNode runs the simulator as cocoon-cri runs it for the pod's VMs: in the node's
// namespace, with the pod's CNI configuration and the attach plugin.
func (n *node) cocoonInNode(podID string, args ...string) string {
	n.t.Helper()
	out, err := n.cocoonCommand(podID, args...)
	if err != nil {
		n.t.Fatalf("cocoon %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (n *node) cocoonCommand(podID string, args ...string) ([]byte, error) {
	network := filepath.Join(n.StateDir, "network")
	full := append([]string{bins.CocoonSim,
		"--root-dir", n.RootDir, "--run-dir", n.RunDir, "--log-dir", n.LogDir,
		"--cni-conf-dir", filepath.Join(network, "pods", podID, "net.d"), "--cni-bin-dir", filepath.Join(network, "bin"),
	}, args...)
	return nsenterNode(n, full...)
}

// nsenterNode runs a command in the node's network namespace, where cocoon-cri runs.
func nsenterNode(n *node, args ...string) ([]byte, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + n.NodeNS, "--"}, args...)...)
	cmd.Env = append(os.Environ(), cocoonsim.NetnsDirEnv+"="+n.VMNetns)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.Bytes()...), err
	}
	return out, nil
}

// hasQEMUChild reports whether a qemu-system process runs with pid as its parent.
func hasQEMUChild(pid int) bool {
	// A child is listed under the thread that forked it, which may be any of the process's.
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return false
	}
	var children []string
	for _, task := range tasks {
		data, _ := os.ReadFile(task)
		children = append(children, strings.Fields(string(data))...)
	}
	for _, child := range children {
		cmdline, _ := os.ReadFile("/proc/" + child + "/cmdline")
		if strings.HasPrefix(filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]), "qemu-system") {
			return true
		}
	}
	return false
}

package qemu_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// A pod network as cocoon builds one for a VM, in namespaces of the test's own: the "node"
// namespace holds the host end of a veth with the gateway address; the VM's namespace holds the
// pod end (eth0, as CNI names it) and the TAP QEMU opens, wired together by tc redirects the way
// cocoon's network/cni tcRedirectInNS does. Nothing touches the host's own network.

var (
	guestAddr = netip.MustParsePrefix("10.77.0.2/24")
	nodeAddr  = netip.MustParsePrefix("10.77.0.1/24")
)

type podNetwork struct {
	vmID   string // hex, like cocoon's VM IDs
	vmNS   string // namespace pins (paths), outside the host's /run/netns
	nodeNS string
	tap    string // tap<VMID[:8]>-0, cocoon's name
	mac    string // the guest's, copied onto eth0 as cocoon does
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("real-guest tests need root, and CI runs as root")
		}
		t.Skip("needs root to create network namespaces and TAP devices")
	}
}

// newNamespaces creates the VM and node namespaces, removed when the test ends. Register it
// before starting QEMU: cleanups run last-in first-out, so the VM is gone before its namespace.
// They are pinned in a directory of the test's own, not in the host's /run/netns (which `ip netns
// add` would create, and make a mount).
func newNamespaces(t *testing.T) *podNetwork {
	t.Helper()
	id := hex.EncodeToString(randomBytes(16))
	mac := randomBytes(6)
	mac[0] = 0x02 // locally administered, unicast
	dir := t.TempDir()
	pod := &podNetwork{
		vmID:   id,
		vmNS:   filepath.Join(dir, "vm"),
		nodeNS: filepath.Join(dir, "node"),
		tap:    "tap" + id[:8] + "-0",
		mac:    net.HardwareAddr(mac).String(),
	}
	for _, ns := range []string{pod.vmNS, pod.nodeNS} {
		pins := &tapmanager.NetNS{}
		if err := pins.CreateNetNS(ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := pins.RemoveNetNS(ns); err != nil {
				t.Errorf("remove netns %s: %v", ns, err)
			}
		})
	}
	return pod
}

// inNS runs a command in the namespace pinned at ns.
func inNS(t *testing.T, ns, name string, args ...string) string {
	t.Helper()
	return run(t, "nsenter", append([]string{"--net=" + ns, "--", name}, args...)...)
}

// wire builds the veth and the TAP (made with the given ip tuntap flags) and redirects between
// them.
func (pod *podNetwork) wire(t *testing.T, tapFlags ...string) {
	t.Helper()
	hostVeth := "veth" + pod.vmID[:8]
	vm, node := pod.vmNS, pod.nodeNS
	ipIn := func(ns string, args ...string) { inNS(t, ns, "ip", args...) }
	tcIn := func(ns string, args ...string) { inNS(t, ns, "tc", args...) }

	ipIn(node, "link", "add", hostVeth, "type", "veth", "peer", "name", "eth0", "netns", pod.vmNS)
	ipIn(node, "addr", "add", nodeAddr.String(), "dev", hostVeth)
	ipIn(node, "link", "set", hostVeth, "up")

	// cocoon: the pod end takes the guest's MAC, so what the cluster learnt for the pod is the
	// guest's address; the TAP matches the pod end's MTU and gets a long transmit queue.
	ipIn(vm, "link", "set", "eth0", "address", pod.mac)
	ipIn(vm, append([]string{"tuntap", "add", "dev", pod.tap, "mode", "tap"}, tapFlags...)...)
	ipIn(vm, "link", "set", pod.tap, "mtu", "1500", "txqueuelen", "10000")
	for _, dev := range []string{"eth0", pod.tap} {
		ipIn(vm, "link", "set", dev, "up")
		tcIn(vm, "qdisc", "add", "dev", dev, "ingress")
	}
	// Everything that enters one leaves through the other: a match-all u32 filter with a mirred
	// egress redirect, each way.
	for _, pair := range [][2]string{{"eth0", pod.tap}, {pod.tap, "eth0"}} {
		tcIn(vm, "filter", "add", "dev", pair[0], "parent", "ffff:", "protocol", "all", "prio", "1",
			"u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", pair[1])
	}
}

// neighbourMAC is the node's neighbour-table entry for addr.
func (pod *podNetwork) neighbourMAC(t *testing.T, addr netip.Addr) string {
	t.Helper()
	out := inNS(t, pod.nodeNS, "ip", "-j", "neigh", "show", addr.String())
	var entries []struct {
		LLAddr string `json:"lladdr"`
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("parse neighbours %q: %v", out, err)
	}
	if len(entries) != 1 {
		t.Fatalf("neighbour entries for %s: %s", addr, out)
	}
	return entries[0].LLAddr
}

// inNetNS runs fn on a thread switched into the namespace pinned at ns: processes it starts and sockets
// it opens belong there. A thread that cannot switch back stays locked, and so retires with
// the test's goroutine rather than run other code in the wrong namespace.
func inNetNS(t *testing.T, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open(ns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("enter netns %s: %v", ns, err)
	}
	defer func() {
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Errorf("leave netns %s: %v", ns, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

// processesMentioning lists the PIDs whose command line contains s.
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand does not fail on Linux; it would crash the program first
	return b
}

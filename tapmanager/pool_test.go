package tapmanager

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// cocoonClones plays cocoon's part of a clone in vmNS: the attach plugin's ADD links the interface
// conf names, and a TAP is wired to it.
func cocoonClones(t *testing.T, conf *attachConf, vmNS string) {
	t.Helper()
	if err := runPlugin(t, attachAdd, conf, vmNS); err != nil {
		t.Fatalf("the plugin's ADD in %s: %v", vmNS, err)
	}
	// A TAP is made through /dev/net/tun, in the calling thread's namespace.
	err := ns.WithNetNSPath(vmNS, func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_DEFAULTS})
	})
	if err == nil {
		err = withHandle(vmNS, wireToTAP)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// runPlugin runs the attach plugin's ADD or DEL as cocoon runs it for the VM namespace vmNS, its
// output (the CNI result) discarded.
func runPlugin(t *testing.T, cmd func(*skel.CmdArgs) error, conf *attachConf, vmNS string) error {
	t.Helper()
	result := conf.PodResult
	if len(result) == 0 {
		result = json.RawMessage(`{"cniVersion":"1.0.0","ips":[{"address":"192.0.2.1/32"}]}`)
	}
	stdin, err := json.Marshal(attachConf{PluginConf: cnitypes.PluginConf{CNIVersion: "1.0.0", Name: CocoonNetwork, Type: AttachPluginName},
		PodNetNS: conf.PodNetNS, HolderFile: conf.HolderFile, PodResult: result})
	if err != nil {
		t.Fatal(err)
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	stdout := os.Stdout
	os.Stdout = devNull
	defer func() { os.Stdout = stdout }()
	return cmd(&skel.CmdArgs{ContainerID: filepath.Base(vmNS), Netns: vmNS, IfName: VMIfName, StdinData: stdin})
}

// waitGone waits until the kernel has destroyed link in nsPath (a namespace is cleaned up
// asynchronously once its last reference goes).
func waitGone(t *testing.T, nsPath, link string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); linkIn(t, nsPath, link) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s is still in %s", link, nsPath)
		}
	}
}

// redirectTarget is where the one filter on link's ingress sends frames.
func redirectTarget(t *testing.T, nsPath, link string) int {
	t.Helper()
	target := -1
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(link)
		if err != nil {
			return err
		}
		filters, err := h.FilterList(l, netlink.HANDLE_INGRESS)
		if err != nil {
			return err
		}
		if len(filters) != 1 {
			t.Errorf("%s has %d ingress filters, want 1", link, len(filters))
		}
		for _, f := range filters {
			if u32, ok := f.(*netlink.U32); ok {
				for _, a := range u32.Actions {
					if m, ok := a.(*netlink.MirredAction); ok {
						target = m.Ifindex
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return target
}

// TestPoolVMTakesThePodInterfaceInPlaceOfItsPlaceholder hands a pool VM a pod's interface: nothing
// moves but an interface an earlier cocoon-cri moved into a VM, a veth pair joins the pod's
// namespace and the VM's, frames cross both ways, and the pod's DEL, after RestorePodInterface,
// releases everything.
func TestPoolVMTakesThePodInterfaceInPlaceOfItsPlaceholder(t *testing.T) {
	n := newTestNetwork(t, "10.78.0.0/24")
	n.masquerade("10.78.0.0/24")
	ctx := context.Background()
	m := &Manager{NetNS: NetNS{Dir: filepath.Join(n.dir, "netns")}, stateDir: filepath.Join(n.dir, "state")}
	poolVM := func(id, name string) string {
		t.Helper()
		if err := m.PreparePoolVM(id); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.RemovePoolVM(id) })
		vmNS := n.newNS(name)
		cocoonClones(t, &attachConf{PodNetNS: m.NetNSPath(id), HolderFile: m.holderFile(id)}, vmNS)
		if l := linkIn(t, vmNS, VMIfName); l == nil || !isPlaceholder(l) {
			t.Fatalf("cocoon's clone has %v, want the placeholder", l)
		}
		return vmNS
	}

	const poolID = "pool0123456789ab"
	if err := m.PreparePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	placeholder := linkIn(t, m.NetNSPath(poolID), PodIfName)
	if placeholder == nil || !isPlaceholder(placeholder) {
		t.Fatalf("the pool namespace holds %v, want the placeholder %s", placeholder, PodIfName)
	}
	// Preparing again (a fill retried after a crash) starts afresh.
	vmNS := poolVM(poolID, "vm")

	pod := n.pod("pooled")
	list, raw, result := n.add(ctx, pod)
	_, mac := PodAddresses(result)
	podAddrs := addrsIn(t, pod.NetNS, PodIfName)
	if err := m.PrepareCocoon(pod.SandboxID, pod.NetNS, raw); err != nil {
		t.Fatal(err)
	}
	holderFile := m.holderFile(pod.SandboxID)
	if len(masqRules(t, n, pod.SandboxID)) == 0 {
		t.Fatal("the bridge plugin set up no masquerade rule: the test would show nothing")
	}

	for range 2 { // a repeat finds the work done
		if err := m.HandOver(pod.SandboxID, pod.NetNS, vmNS); err != nil {
			t.Fatal(err)
		}
	}
	checkWired(t, pod.NetNS, vmNS, mac)
	if got := readRecord(holderFile); got != (holderRecord{At: pod.NetNS, WiredTo: vmNS}) {
		t.Fatalf("holder record %+v", got)
	}
	framesCross(t, n, pod.NetNS, vmNS, podAddrs[0], mac)
	// The pod's interface is never taken into the VM's namespace, and stays when the VM goes.
	if err := Reclaim(pod.NetNS, vmNS, VMIfName, result); err != nil {
		t.Fatal(err)
	}
	if l := linkIn(t, vmNS, VMIfName); l == nil || isPodInterface(l) {
		t.Fatalf("a reclaim took %v from the VM's namespace", l)
	}
	// The placeholder goes with the pool VM's namespace.
	if l := linkIn(t, vmNS, placeholderPeer); l == nil || !isPlaceholder(l) {
		t.Fatalf("the placeholder set aside: %v", l)
	}
	if err := m.RemovePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	waitGone(t, vmNS, placeholderPeer)

	// An earlier cocoon-cri moved the interface into a clone's namespace, which keeps it while the
	// clone is stopped: the hand-over takes it home first. An earlier try of the hand-over was cut
	// short after it made the pair, before it marked its end.
	oldVM := n.newNS("old")
	if err := moveLink(pod.NetNS, PodIfName, oldVM, VMIfName); err != nil {
		t.Fatal(err)
	}
	if err := writeHolder(holderFile, oldVM); err != nil {
		t.Fatal(err)
	}
	vm2 := poolVM("pool2123456789ab", "vm2")
	podNS, err := netns.GetFromPath(pod.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	if err := withHandle(vm2, func(h *netlink.Handle) error {
		hw, _ := net.ParseMAC(mac)
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: linkNewName, HardwareAddr: hw}, PeerName: linkEndName(vm2), PeerNamespace: netlink.NsFd(podNS)})
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.HandOver(pod.SandboxID, pod.NetNS, vm2); err != nil {
		t.Fatal(err)
	}
	checkWired(t, pod.NetNS, vm2, mac)
	if linkIn(t, oldVM, VMIfName) != nil {
		t.Fatal("the stopped clone still holds the pod interface")
	}
	framesCross(t, n, pod.NetNS, vm2, podAddrs[0], mac)

	// The pod's DEL finds the interface as the cluster's CNI left it.
	for range 2 {
		if err := m.RestorePodInterface(pod.SandboxID, pod.NetNS, raw); err != nil {
			t.Fatal(err)
		}
	}
	if got := addrsIn(t, pod.NetNS, PodIfName); strings.Join(got, ",") != strings.Join(podAddrs, ",") {
		t.Fatalf("addresses after the restore %v, want %v", got, podAddrs)
	}
	if got := readRecord(holderFile); got != (holderRecord{At: pod.NetNS}) {
		t.Fatalf("holder record after the restore %+v", got)
	}
	if q := ingressQdiscs(t, pod.NetNS, PodIfName); q != 0 {
		t.Fatalf("the restored interface keeps %d ingress qdiscs", q)
	}
	n.delReleasesAll(ctx, list, pod)
}

// checkWired checks a hand-over's work: the pod interface home without addresses, a veth pair
// between the namespaces, and tc sending every frame pod interface -> pair -> TAP and back.
func checkWired(t *testing.T, podNS, vmNS, mac string) {
	t.Helper()
	eth0 := linkIn(t, podNS, PodIfName)
	if eth0 == nil || eth0.Attrs().HardwareAddr.String() != mac {
		t.Fatalf("the pod's namespace has %v, want the pod interface with MAC %s", eth0, mac)
	}
	if got := addrsIn(t, podNS, PodIfName); len(got) != 0 {
		t.Fatalf("the pod interface keeps addresses %v: the guest owns them", got)
	}
	vmEnd, podEnd, tap := linkIn(t, vmNS, VMIfName), linkIn(t, podNS, linkEndName(vmNS)), linkIn(t, vmNS, "tap0")
	if vmEnd == nil || vmEnd.Type() != "veth" || isPodInterface(vmEnd) || podEnd == nil || podEnd.Type() != "veth" {
		t.Fatalf("the pair: %v in the VM's namespace, %v in the pod's", vmEnd, podEnd)
	}
	if vmEnd.Attrs().HardwareAddr.String() != mac {
		t.Errorf("the pair's end in the VM's namespace has MAC %s, want the pod's %s: cocoon gives it to the guest", vmEnd.Attrs().HardwareAddr, mac)
	}
	if vmEnd.Attrs().MTU != eth0.Attrs().MTU || podEnd.Attrs().MTU != eth0.Attrs().MTU {
		t.Errorf("MTUs: pair %d/%d, pod interface %d", vmEnd.Attrs().MTU, podEnd.Attrs().MTU, eth0.Attrs().MTU)
	}
	for _, end := range []struct{ ns, name string }{{vmNS, VMIfName}, {podNS, podEnd.Attrs().Name}} {
		if mode := ipv6AddrGenMode(t, end.ns, end.name); mode != "1" {
			t.Errorf("the pair's end %s makes IPv6 addresses (addr_gen_mode %s), and speaks on the pod's link with them", end.name, mode)
		}
	}
	for _, w := range []struct {
		ns, from string
		to       netlink.Link
	}{{podNS, PodIfName, podEnd}, {podNS, podEnd.Attrs().Name, eth0}, {vmNS, VMIfName, tap}, {vmNS, "tap0", vmEnd}} {
		if got := redirectTarget(t, w.ns, w.from); got != w.to.Attrs().Index {
			t.Errorf("%s's frames go to ifindex %d, want %s's %d", w.from, got, w.to.Attrs().Name, w.to.Attrs().Index)
		}
	}
}

// ipv6AddrGenMode reads a link's IPv6 address generation mode (1: none) in its namespace.
func ipv6AddrGenMode(t *testing.T, nsPath, name string) string {
	t.Helper()
	var mode []byte
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) (err error) {
		mode, err = os.ReadFile("/proc/sys/net/ipv6/conf/" + name + "/addr_gen_mode")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(mode))
}

// framesCross sends a UDP packet from the node to the pod's address and reads, on the VM's TAP,
// the ARP request for it that crossed pod interface, pair and TAP; then answers it from the TAP
// with the pod's MAC, and waits for the node to learn that MAC: frames cross both ways.
func framesCross(t *testing.T, n *testNetwork, podNS, vmNS, podAddr, mac string) {
	t.Helper()
	podIP, _, err := net.ParseCIDR(podAddr)
	if err != nil {
		t.Fatal(err)
	}
	podMAC, _ := net.ParseMAC(mac)
	var tap *os.File
	err = ns.WithNetNSPath(vmNS, func(ns.NetNS) error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		req, err := unix.NewIfreq("tap0")
		if err == nil {
			req.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, req)
		}
		if err != nil {
			unix.Close(fd) //nolint:errcheck
			return fmt.Errorf("attach to tap0: %w", err)
		}
		tap = os.NewFile(uintptr(fd), "tap0")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	if err := withHandle(vmNS, func(h *netlink.Handle) error {
		l, err := h.LinkByName("tap0")
		if err == nil {
			err = h.LinkSetUp(l)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The node asks for the pod's MAC only when it does not know it.
	if err := withHandle(n.node, func(h *netlink.Handle) error {
		neighs, err := h.NeighList(0, netlink.FAMILY_V4)
		for _, nb := range neighs {
			if nb.IP.Equal(podIP) {
				if err := h.NeighDel(&nb); err != nil {
					return err
				}
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var conn net.PacketConn
	n.inNode(func() error {
		conn, err = net.ListenPacket("udp4", ":0")
		return err
	})
	defer conn.Close()

	var request []byte
	buf := make([]byte, 2048)

	for deadline := time.Now().Add(30 * time.Second); request == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no ARP request for the pod reached the VM's TAP")
		}
		if _, err := conn.WriteTo([]byte("hello"), &net.UDPAddr{IP: podIP, Port: 9}); err != nil {
			t.Fatal(err)
		}
		tap.SetReadDeadline(time.Now().Add(200 * time.Millisecond)) //nolint:errcheck
		for {
			size, err := tap.Read(buf)
			if err != nil {
				break
			}
			f := buf[:size]
			if size >= 42 && f[12] == 0x08 && f[13] == 0x06 && f[21] == 1 && net.IP(f[38:42]).Equal(podIP) {
				request = slices.Clone(f)
				break
			}
		}
	}
	// The reply: to the asker, from the pod's MAC and address.
	reply := make([]byte, 42)
	copy(reply[0:6], request[6:12])
	copy(reply[6:12], podMAC)
	copy(reply[12:22], []byte{0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2})
	copy(reply[22:28], podMAC)
	copy(reply[28:32], podIP.To4())
	copy(reply[32:42], request[22:32])
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := tap.Write(reply); err != nil {
			t.Fatal(err)
		}
		if learned(t, n.node, podIP) == mac {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never learned %s at %s from the VM's answer", podIP, mac)
		}
	}
}

// learned is the MAC the namespace's neighbour table has for ip; "" when none.
func learned(t *testing.T, nsPath string, ip net.IP) string {
	t.Helper()
	var mac string
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		neighs, err := h.NeighList(0, netlink.FAMILY_V4)
		for _, nb := range neighs {
			if nb.IP.Equal(ip) && nb.HardwareAddr != nil {
				mac = nb.HardwareAddr.String()
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// ingressQdiscs counts link's ingress qdiscs.
func ingressQdiscs(t *testing.T, nsPath, link string) int {
	t.Helper()
	count := 0
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(link)
		if err != nil {
			return err
		}
		qdiscs, err := h.QdiscList(l)
		for _, q := range qdiscs {
			if q.Attrs().Parent == netlink.HANDLE_INGRESS {
				count++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return count
}

// handOverBench makes, outside the benchmark's timer, what a hand-over starts from: a pod's
// namespace holding the pod interface (its veth's other end in a node namespace) with an address,
// and a pool VM's namespace holding the placeholder and a TAP wired to it.
func handOverBench(b *testing.B, nets *NetNS, i int) (podNS, vmNS string) {
	b.Helper()
	node, podNS, vmNS := filepath.Join(nets.Dir, fmt.Sprintf("node%d", i)), filepath.Join(nets.Dir, fmt.Sprintf("pod%d", i)), filepath.Join(nets.Dir, fmt.Sprintf("vm%d", i))
	for _, p := range []string{node, podNS, vmNS} {
		if err := nets.CreateNetNS(p); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = nets.RemoveNetNS(p) })
	}
	pod, err := netns.GetFromPath(podNS)
	if err != nil {
		b.Fatal(err)
	}
	defer pod.Close()
	err = withHandle(node, func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: PodIfName, PeerNamespace: netlink.NsFd(pod)})
	})
	if err == nil {
		err = withHandle(podNS, func(h *netlink.Handle) error {
			eth0, err := h.LinkByName(PodIfName)
			if err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("10.79.0.2/24")
			if err := h.AddrAdd(eth0, addr); err != nil {
				return err
			}
			return h.LinkSetUp(eth0)
		})
	}
	if err == nil {
		err = ns.WithNetNSPath(vmNS, func(ns.NetNS) error {
			placeholder := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: VMIfName}, PeerName: "pool-end"}
			if err := netlink.LinkAdd(placeholder); err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(placeholder, placeholderAlias); err != nil {
				return err
			}
			return netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_DEFAULTS})
		})
	}
	if err == nil {
		err = withHandle(vmNS, wireToTAP)
	}
	if err != nil {
		b.Fatal(err)
	}
	return podNS, vmNS
}

// BenchmarkHandOver is the host's side of a warm pool hand-over: the pod interface wired to the
// pool VM's TAP through a veth pair made across the two namespaces.
func BenchmarkHandOver(b *testing.B) {
	testproc.RequireRoot(b, "a network namespace")
	dir := b.TempDir()
	m := &Manager{NetNS: NetNS{Dir: filepath.Join(dir, "netns")}, stateDir: filepath.Join(dir, "state")}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		podNS, vmNS := handOverBench(b, &m.NetNS, i)
		id := fmt.Sprintf("sandbox%d", i)
		if err := os.MkdirAll(filepath.Dir(m.holderFile(id)), 0o755); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := m.HandOver(id, podNS, vmNS); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMoveLink is what the hand-over did before it made a pair: the pod interface moved
// into the VM's namespace, the kernel's RCU waits under the RTNL lock included.
func BenchmarkMoveLink(b *testing.B) {
	testproc.RequireRoot(b, "a network namespace")
	nets := &NetNS{Dir: filepath.Join(b.TempDir(), "netns")}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		podNS, vmNS := handOverBench(b, nets, i)
		if err := withHandle(vmNS, func(h *netlink.Handle) error {
			placeholder, err := h.LinkByName(VMIfName)
			if err != nil {
				return err
			}
			return h.LinkSetName(placeholder, "aside")
		}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := moveLink(podNS, PodIfName, vmNS, VMIfName); err != nil {
			b.Fatal(err)
		}
	}
}

package tapmanager

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// frame builds an Ethernet frame of the given type with payload bytes at their offsets after the
// 14-byte header.
func frame(etherType uint16, size int, at map[int][]byte) []byte {
	f := make([]byte, size)
	f[12], f[13] = byte(etherType>>8), byte(etherType)
	for off, b := range at {
		copy(f[off:], b)
	}
	return f
}

func TestTrafficFilterCountsUseNotNeighbourProtocols(t *testing.T) {
	pod := net.ParseIP("10.1.2.3").To4()
	arpRequest := func(target net.IP) []byte {
		return frame(0x0806, 42, map[int][]byte{offARPOp: {0, 1}, offARPTargetIP: target})
	}
	arpReply := frame(0x0806, 42, map[int][]byte{offARPOp: {0, 2}, offARPTargetIP: pod})
	ipv4 := frame(0x0800, 60, nil)
	ipv6TCP := frame(0x86dd, 74, map[int][]byte{offIPv6Next: {6}})
	icmpv6 := func(typ byte) []byte {
		return frame(0x86dd, 78, map[int][]byte{offIPv6Next: {58}, offICMPv6Type: {typ}})
	}
	lldp := frame(0x88cc, 60, nil)

	cases := []struct {
		name           string
		frame          []byte
		awake, waiting bool // accepted while counting use, and while waiting for it
	}{
		{"IPv4", ipv4, true, true},
		{"IPv6 TCP", ipv6TCP, true, true},
		{"ICMPv6 echo", icmpv6(128), true, true},
		{"multicast listener query", icmpv6(130), false, false},
		{"multicast listener report v2", icmpv6(143), false, false},
		{"router solicitation", icmpv6(133), false, false},
		{"neighbour solicitation", icmpv6(135), false, false},
		{"redirect", icmpv6(137), false, false},
		{"ICMPv6 138", icmpv6(138), true, true},
		{"ARP request for the pod", arpRequest(pod), false, true},
		{"ARP request for another address", arpRequest(net.ParseIP("10.1.2.4").To4()), false, false},
		{"ARP reply", arpReply, false, false},
		{"LLDP", lldp, false, false},
	}
	run := func(prog []bpf.Instruction, f []byte) bool {
		vm, err := bpf.NewVM(prog)
		if err != nil {
			t.Fatal(err)
		}
		n, err := vm.Run(f)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	for _, c := range cases {
		if got := run(trafficFilter(nil), c.frame); got != c.awake {
			t.Errorf("%s while counting use: accepted %v, want %v", c.name, got, c.awake)
		}
		if got := run(trafficFilter(pod), c.frame); got != c.waiting {
			t.Errorf("%s while waiting for use: accepted %v, want %v", c.name, got, c.waiting)
		}
	}
}

// A watch on an interface without an address, as the pod interface is in a VM's namespace: an ARP
// request for the pod's address ends a wait, and an IPv4 packet is counted.
func TestTrafficWatchOnARealInterface(t *testing.T) {
	testproc.RequireRoot(t, "a network namespace")
	nets := &NetNS{Dir: filepath.Join(t.TempDir(), "netns")}
	vmNS, peerNS := filepath.Join(nets.Dir, "vm"), filepath.Join(nets.Dir, "peer")
	for _, p := range []string{vmNS, peerNS} {
		if err := nets.CreateNetNS(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nets.RemoveNetNS(p) })
	}
	err := withHandle(peerNS, func(h *netlink.Handle) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "p0"}, PeerName: VMIfName}
		if err := h.LinkAdd(veth); err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.250.0.1/24")
		if err := h.AddrAdd(veth, addr); err != nil {
			return err
		}
		if err := h.LinkSetUp(veth); err != nil {
			return err
		}
		peer, err := h.LinkByName(VMIfName)
		if err != nil {
			return err
		}
		target, err := netns.GetFromPath(vmNS)
		if err != nil {
			return err
		}
		defer target.Close()
		return h.LinkSetNsFd(peer, int(target))
	})
	if err != nil {
		t.Fatal(err)
	}
	var eth0 netlink.Link
	if err := withHandle(vmNS, func(h *netlink.Handle) error {
		if eth0, err = h.LinkByName(VMIfName); err != nil {
			return err
		}
		return h.LinkSetUp(eth0)
	}); err != nil {
		t.Fatal(err)
	}

	podIP := net.ParseIP("10.250.0.2")
	w, err := WatchTraffic(vmNS, podIP)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	var conn net.PacketConn
	if err := ns.WithNetNSPath(peerNS, func(ns.NetNS) error {
		var err error
		conn, err = net.ListenPacket("udp4", "10.250.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func() {
		if _, err := conn.WriteTo([]byte("hello"), &net.UDPAddr{IP: podIP, Port: 9}); err != nil {
			t.Fatal(err)
		}
	}

	// Nobody answers for the pod's address: the peer sends ARP requests only, and the wait ends on
	// one of them. The peer is asked again until it does, since the wait may begin after a request.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	woke := make(chan error, 1)
	go func() { woke <- w.WaitForUse(ctx) }()
	for waiting := true; waiting; {
		send()
		select {
		case err := <-woke:
			if err != nil {
				t.Fatalf("waiting for an ARP request for the pod: %v", err)
			}
			waiting = false
		case <-time.After(200 * time.Millisecond):
		}
	}

	// With the pod's MAC known to the peer, its packets reach the interface, and are counted.
	err = withHandle(peerNS, func(h *netlink.Handle) error {
		p0, err := h.LinkByName("p0")
		if err != nil {
			return err
		}
		return h.NeighSet(&netlink.Neigh{LinkIndex: p0.Attrs().Index, IP: podIP, HardwareAddr: eth0.Attrs().HardwareAddr, State: netlink.NUD_PERMANENT})
	})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		send()
		seen, err := w.Seen()
		if err != nil {
			t.Fatal(err)
		}
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a UDP packet to the pod was never counted")
		}
	}

	// A wait ends when its context does.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := w.WaitForUse(ctx2); err != context.Canceled {
		t.Fatalf("a cancelled wait: %v", err)
	}
}

package tapmanager

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// podNamespaceWithInterface makes a pod namespace holding an interface named like the pod's.
func podNamespaceWithInterface(t testing.TB) (*NetNS, string) {
	t.Helper()
	testproc.RequireRoot(t, "a network namespace")
	n := &NetNS{Dir: filepath.Join(t.TempDir(), "netns")}
	path := n.NetNSPath("0123456789abcdef0123456789abcdef")
	if err := n.CreateNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.RemoveNetNS(path) })
	err := withHandle(path, func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: PodIfName}, PeerName: "peer0"})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, path
}

// TestPodInterfaceCounters: the counters are read through a socket kept in the namespace, which
// RemoveNetNS closes: the namespace and its interfaces go, and are not opened again.
func TestPodInterfaceCounters(t *testing.T) {
	n, path := podNamespaceWithInterface(t)
	for range 2 {
		iface, err := n.PodInterfaceCounters(path)
		if err != nil || iface.Name != PodIfName {
			t.Fatalf("counters: %+v %v", iface, err)
		}
	}
	if _, err := n.PodInterfaceCounters(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("counters of a namespace that does not exist")
	}
	// The peer is in the test's own namespace only while the pod namespace lives.
	var peer netlink.Link
	err := withHandle(path, func(h *netlink.Handle) error {
		var err error
		peer, err = h.LinkByName("peer0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var ns unix.Stat_t
	if err := unix.Stat(path, &ns); err != nil {
		t.Fatal(err)
	}
	if err := n.RemoveNetNS(path); err != nil {
		t.Fatal(err)
	}
	if _, err := n.PodInterfaceCounters(path); err == nil {
		t.Fatal("counters of a removed namespace")
	}
	if len(n.counters.sockets)+len(n.counters.removing) != 0 {
		t.Fatalf("sockets kept after the removal: %v %v", n.counters.sockets, n.counters.removing)
	}
	// A namespace nothing holds is freed, its veth with it: the kernel lists no namespace with its
	// inode among the live ones.
	if nsStillAlive(t, ns.Ino) {
		t.Fatalf("namespace %d (veth %s) outlived RemoveNetNS: a socket still holds it", ns.Ino, peer.Attrs().Name)
	}
}

// Counters read while the namespace is removed either answer or fail; none reads a closed socket
// (run with -race), and no socket is left behind.
func TestPodInterfaceCountersDuringRemoval(t *testing.T) {
	n, path := podNamespaceWithInterface(t)
	if _, err := n.PodInterfaceCounters(path); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				_, _ = n.PodInterfaceCounters(path)
			}
		})
	}
	if err := n.RemoveNetNS(path); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(n.counters.sockets)+len(n.counters.removing) != 0 {
		t.Fatalf("sockets kept after the removal: %v %v", n.counters.sockets, n.counters.removing)
	}
}

// TestPodInterfaceCountersCountFrames: the counters are the interface's own, received apart from
// sent, and follow an interface that was replaced under the same name (a new index), as one a VM
// held and gave back may be. Frames are sent raw on a veth pair inside the namespace, with IPv6 off
// so that nothing else is sent.
func TestPodInterfaceCountersCountFrames(t *testing.T) {
	n, path := podNamespaceWithInterface(t)
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("1"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	sendFrames := func(ifname string, count, size int) {
		t.Helper()
		err := ns.WithNetNSPath(path, func(ns.NetNS) error {
			h, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer h.Close()
			for _, name := range []string{PodIfName, "peer0"} {
				link, err := h.LinkByName(name)
				if err != nil {
					return err
				}
				if err := h.LinkSetUp(link); err != nil {
					return err
				}
			}
			link, err := h.LinkByName(ifname)
			if err != nil {
				return err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			frame := make([]byte, size)
			copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5}) // broadcast, local experimental ethertype
			to := &unix.SockaddrLinklayer{Ifindex: link.Attrs().Index, Halen: 6}
			for range count {
				if err := unix.Sendto(fd, frame, 0, to); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sendFrames(PodIfName, 3, 100)
	sendFrames("peer0", 2, 80)
	got, err := n.PodInterfaceCounters(path)
	if want := (vmstats.Interface{Name: PodIfName, TxBytes: 300, RxBytes: 160}); err != nil || got != want {
		t.Fatalf("counters: %+v, %v; want %+v", got, err, want)
	}

	// A new interface of the same name, under a new index.
	err = withHandle(path, func(h *netlink.Handle) error {
		old, err := h.LinkByName(PodIfName)
		if err != nil {
			return err
		}
		if err := h.LinkDel(old); err != nil {
			return err
		}
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: PodIfName}, PeerName: "peer0"})
	})
	if err != nil {
		t.Fatal(err)
	}
	sendFrames(PodIfName, 1, 64)
	got, err = n.PodInterfaceCounters(path)
	if want := (vmstats.Interface{Name: PodIfName, TxBytes: 64}); err != nil || got != want {
		t.Fatalf("counters of the new interface: %+v, %v; want %+v", got, err, want)
	}
}

// nsStillAlive reports whether a socket of this process is in network namespace ino (SIOCGSKNS
// opens a socket's namespace): a socket left open keeps its namespace alive.
func nsStillAlive(t *testing.T, ino uint64) bool {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
		if err != nil {
			continue // not a socket
		}
		var st unix.Stat_t
		err = unix.Fstat(nsfd, &st)
		unix.Close(nsfd)
		if err == nil && st.Ino == ino {
			return true
		}
	}
	return false
}

// BenchmarkPodInterfaceCounters is ListPodSandboxStats's cost per pod whose VM does not run.
func BenchmarkPodInterfaceCounters(b *testing.B) {
	n, path := podNamespaceWithInterface(b)
	for b.Loop() {
		if _, err := n.PodInterfaceCounters(path); err != nil {
			b.Fatal(err)
		}
	}
}

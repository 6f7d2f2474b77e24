package tapmanager

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podNamespaceWithInterface makes a pod namespace holding an interface named like the pod's.
func podNamespaceWithInterface(t testing.TB) (*NetNS, string) {
	t.Helper()
	requireRoot(t)
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
	if len(n.counters.handles)+len(n.counters.removing) != 0 {
		t.Fatalf("sockets kept after the removal: %v %v", n.counters.handles, n.counters.removing)
	}
	// A namespace nothing holds is freed, its veth with it: the kernel lists no namespace with its
	// inode among the live ones.
	if nsStillAlive(t, ns.Ino) {
		t.Fatalf("namespace %d (veth %s) outlived RemoveNetNS: a socket still holds it", ns.Ino, peer.Attrs().Name)
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

package tapmanager

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// cocoonClones plays cocoon's part of a clone in vmNS: the attach plugin's ADD takes the interface
// named by conf, and a TAP is wired to it.
func cocoonClones(t *testing.T, conf *attachConf, vmNS string) {
	t.Helper()
	if err := takeInterface(conf, vmNS, VMIfName); err != nil {
		t.Fatal(err)
	}
	if err := writeHolder(conf.HolderFile, vmNS); err != nil {
		t.Fatal(err)
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

func TestPoolVMTakesThePodInterfaceInPlaceOfItsPlaceholder(t *testing.T) {
	n := newTestNetwork(t, "10.78.0.0/24")
	ctx := context.Background()
	m := &Manager{NetNS: NetNS{Dir: filepath.Join(n.dir, "netns")}, stateDir: filepath.Join(n.dir, "state")}

	const poolID = "pool0123456789ab"
	if err := m.PreparePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.RemovePoolVM(poolID) })
	placeholder := linkIn(t, m.NetNSPath(poolID), PodIfName)
	if placeholder == nil || !isPlaceholder(placeholder) {
		t.Fatalf("the pool namespace holds %v, want the placeholder %s", placeholder, PodIfName)
	}
	// Preparing again (a fill retried after a crash) starts afresh.
	if err := m.PreparePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	vmNS := n.newNS("vm")
	cocoonClones(t, &attachConf{PodNetNS: m.NetNSPath(poolID), HolderFile: m.holderFile(poolID)}, vmNS)
	if l := linkIn(t, vmNS, VMIfName); l == nil || !isPlaceholder(l) {
		t.Fatalf("cocoon's clone has %v, want the placeholder", l)
	}

	pod := n.pod("pooled")
	list, raw, result := n.add(ctx, pod)
	_, mac := PodAddresses(result)
	podAddrs := addrsIn(t, pod.NetNS, PodIfName)
	if err := m.PrepareCocoon(pod.SandboxID, pod.NetNS, raw); err != nil {
		t.Fatal(err)
	}

	for range 2 { // a repeat finds the work done
		if err := m.HandOver(pod.SandboxID, pod.NetNS, vmNS); err != nil {
			t.Fatal(err)
		}
	}
	eth0, tap := linkIn(t, vmNS, VMIfName), linkIn(t, vmNS, "tap0")
	if eth0 == nil || eth0.Attrs().HardwareAddr.String() != mac {
		t.Fatalf("the VM's namespace has %v, want the pod interface with MAC %s", eth0, mac)
	}
	if got := addrsIn(t, vmNS, VMIfName); len(got) != 0 {
		t.Fatalf("the pod interface keeps addresses %v in the VM's namespace: the guest owns them", got)
	}
	if linkIn(t, pod.NetNS, PodIfName) != nil {
		t.Fatal("the pod interface is still in the pod's namespace")
	}
	if got := redirectTarget(t, vmNS, VMIfName); got != tap.Attrs().Index {
		t.Fatalf("the pod interface's frames go to ifindex %d, want the TAP's %d", got, tap.Attrs().Index)
	}
	if got := redirectTarget(t, vmNS, "tap0"); got != eth0.Attrs().Index {
		t.Fatalf("the TAP's frames go to ifindex %d, want the pod interface's %d", got, eth0.Attrs().Index)
	}
	if got := readHolder(m.holderFile(pod.SandboxID)); got != vmNS {
		t.Fatalf("holder %q, want %q", got, vmNS)
	}
	// The placeholder goes with the pool VM's namespace.
	if l := linkIn(t, vmNS, placeholderPeer); l == nil || !isPlaceholder(l) {
		t.Fatalf("the placeholder set aside: %v", l)
	}
	if err := m.RemovePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	waitGone(t, vmNS, placeholderPeer)

	// The pod's interface comes back as from any VM; a placeholder never goes to a pod.
	if err := Reclaim(pod.NetNS, vmNS, VMIfName, result); err != nil {
		t.Fatal(err)
	}
	if got := addrsIn(t, pod.NetNS, PodIfName); len(got) != 1 || got[0] != podAddrs[0] {
		t.Fatalf("addresses after reclaim %v, want %v", got, podAddrs)
	}
	if err := m.PreparePoolVM(poolID); err != nil {
		t.Fatal(err)
	}
	otherVM := n.newNS("vm2")
	cocoonClones(t, &attachConf{PodNetNS: m.NetNSPath(poolID), HolderFile: m.holderFile(poolID)}, otherVM)
	if err := Reclaim(pod.NetNS, otherVM, VMIfName, result); err != nil {
		t.Fatal(err)
	}
	if l := linkIn(t, pod.NetNS, PodIfName); l == nil || l.Attrs().HardwareAddr.String() != mac {
		t.Fatalf("the pod namespace has %v after reclaiming from a pool VM, want its own interface", l)
	}
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
}

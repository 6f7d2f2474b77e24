package tapmanager

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
)

// TestThePodsDELFindsItsInterfaceAsTheCNILeftIt follows the pod interface through what the
// kubelet's order of stops leaves: its counters are read at home while it is wired to a stopped
// VM, a reclaim takes nothing from that VM, and RestorePodInterface gives it back its addresses,
// so the pod's CNI DEL leaves no lease, veth or masquerade rule. An interface an earlier cocoon-cri
// moved into a stopped VM is read there and taken back by ReclaimFromVM, as it was then.
func TestThePodsDELFindsItsInterfaceAsTheCNILeftIt(t *testing.T) {
	n := newTestNetwork(t, "10.78.0.0/24")
	n.masquerade("10.78.0.0/24")
	ctx := context.Background()
	m := NewManager(Config{NetNSDir: n.nets.Dir, ConfDir: n.confDir, BinDirs: []string{debianPlugins}, StateDir: filepath.Join(n.dir, "state")})
	pod := n.pod("db")
	list, raw, _ := n.add(ctx, pod)
	if err := m.PrepareCocoon(pod.SandboxID, pod.NetNS, raw); err != nil {
		t.Fatal(err)
	}
	if len(masqRules(t, n, pod.SandboxID)) == 0 {
		t.Fatal("the bridge plugin set up no masquerade rule: the test would show nothing")
	}
	podAddrs := addrsIn(t, pod.NetNS, PodIfName)
	holderFile := m.holderFile(pod.SandboxID)
	conf := &attachConf{PodNetNS: pod.NetNS, HolderFile: holderFile, PodResult: raw}
	counters := func(when string) {
		t.Helper()
		if st, err := m.PodInterfaceCounters(pod.SandboxID, pod.NetNS); err != nil || st.Name != PodIfName {
			t.Fatalf("counters %s: %+v, %v", when, st, err)
		}
	}

	counters("before any VM")
	vm1 := n.newNS("vm1")
	cocoonClones(t, conf, vm1)
	// vm1 stopped, and stays: StopContainer moves nothing.
	counters("while wired to a stopped VM")
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm1, raw); err != nil {
		t.Fatal(err)
	}
	if linkIn(t, vm1, VMIfName) == nil || len(addrsIn(t, pod.NetNS, PodIfName)) != 0 {
		t.Fatal("a reclaim took the pair's end for the pod interface")
	}
	for range 2 {
		if err := m.RestorePodInterface(pod.SandboxID, pod.NetNS, raw); err != nil {
			t.Fatal(err)
		}
	}
	if got := addrsIn(t, pod.NetNS, PodIfName); strings.Join(got, ",") != strings.Join(podAddrs, ",") || readHolder(holderFile) != pod.NetNS {
		t.Fatalf("after the restore: addresses %v (want %v), record %+v", got, podAddrs, readRecord(holderFile))
	}

	// An earlier cocoon-cri's stopped VM holds the interface: its counters are read there, and it
	// comes back for the DEL.
	vm2 := n.newNS("vm2")
	if err := moveLink(pod.NetNS, PodIfName, vm2, VMIfName); err != nil {
		t.Fatal(err)
	}
	if err := writeHolder(holderFile, vm2); err != nil {
		t.Fatal(err)
	}
	counters("while an earlier VM holds it")
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm2, raw); err != nil {
		t.Fatal(err)
	}
	if got := readHolder(holderFile); got != pod.NetNS || strings.Join(addrsIn(t, pod.NetNS, PodIfName), ",") != strings.Join(podAddrs, ",") {
		t.Fatalf("after the reclaim the record says %s", got)
	}
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm2, raw); err != nil {
		t.Fatalf("a repeated reclaim: %v", err)
	}

	n.delReleasesAll(ctx, list, pod)
	// vm1's removal after the pod's DEL finds nothing to give back.
	if err := runPlugin(t, attachDel, conf, vm1); err != nil {
		t.Fatal(err)
	}
	if _, err := m.PodInterfaceCounters(pod.SandboxID, pod.NetNS); err == nil {
		t.Error("counters of an interface the DEL removed")
	}
}

// masquerade configures the bridge network with ipMasq: the bridge plugin tears its rules down for
// the addresses it finds on the pod interface at DEL, so a DEL that does not find them where they
// belong leaks the rules.
func (n *testNetwork) masquerade(subnet string) {
	n.t.Helper()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [
	  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
	   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}]}`,
		subnet, filepath.Join(n.dir, "ipam"))
	if err := os.WriteFile(filepath.Join(n.confDir, "10-pods.conflist"), []byte(conf), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// delReleasesAll runs the pod's CNI DEL and checks that it left no IP lease, masquerade rule or
// node veth: it found the pod interface as the cluster's CNI left it.
func (n *testNetwork) delReleasesAll(ctx context.Context, list *libcni.NetworkConfigList, pod Pod) {
	n.t.Helper()
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if leases := n.leases(); len(leases) != 0 {
		n.t.Errorf("IP leases left: %v", leases)
	}
	if rules := masqRules(n.t, n, pod.SandboxID); len(rules) != 0 {
		n.t.Errorf("masquerade rules left: %q", rules)
	}
	if veths := vethsIn(n.t, n.node); len(veths) != 0 {
		n.t.Errorf("veths left on the node: %q", veths)
	}
}

// masqRules are the node's NAT rules that name the sandbox (the bridge plugin's comment does).
func masqRules(t *testing.T, n *testNetwork, sandboxID string) []string {
	t.Helper()
	var out []byte
	n.inNode(func() error {
		var err error
		out, err = exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables: %v: %s", err, out)
		}
		return nil
	})
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, sandboxID) {
			rules = append(rules, line)
		}
	}
	return rules
}

func vethsIn(t *testing.T, nsPath string) []string {
	t.Helper()
	var names []string
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		links, err := h.LinkList()
		for _, l := range links {
			if l.Type() == "veth" {
				names = append(names, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

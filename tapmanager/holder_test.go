package tapmanager

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
)

// TestStoppedVMKeepsThePodInterface follows the interface when nothing takes it back at a stop:
// its counters are read where it is, the next VM takes it from the stopped one, the stopped VM's
// removal (the plugin's DEL) leaves the record of the running VM alone, and it comes back, with
// its addresses, only for the pod's CNI DEL, which then leaves no lease, veth or masquerade rule.
func TestStoppedVMKeepsThePodInterface(t *testing.T) {
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
	conf1 := &attachConf{PodNetNS: pod.NetNS, HolderFile: holderFile, PodResult: raw}
	attach := func(vm string) {
		t.Helper()
		if err := takeInterface(conf1, vm, VMIfName); err != nil {
			t.Fatal(err)
		}
		if err := writeHolder(holderFile, vm); err != nil {
			t.Fatal(err)
		}
	}
	detach := func(vm string) {
		t.Helper()
		stdin, err := json.Marshal(attachConf{PluginConf: cnitypes.PluginConf{CNIVersion: "1.0.0", Name: CocoonNetwork, Type: AttachPluginName},
			PodNetNS: pod.NetNS, HolderFile: holderFile, PodResult: raw})
		if err != nil {
			t.Fatal(err)
		}
		if err := attachDel(&skel.CmdArgs{ContainerID: vm, Netns: vm, IfName: VMIfName, StdinData: stdin}); err != nil {
			t.Fatalf("the plugin's DEL in %s: %v", vm, err)
		}
	}
	counters := func(when string) {
		t.Helper()
		if st, err := m.PodInterfaceCounters(pod.SandboxID, pod.NetNS); err != nil || st.Name != PodIfName {
			t.Fatalf("counters %s: %+v, %v", when, st, err)
		}
	}

	counters("before any VM")
	vm1 := n.newNS("vm1")
	attach(vm1)
	// vm1 stopped: StopContainer leaves the interface where it is.
	counters("while a stopped VM holds it")
	vm2 := n.newNS("vm2")
	attach(vm2)
	if linkIn(t, vm2, VMIfName) == nil || linkIn(t, vm1, VMIfName) != nil {
		t.Fatal("the next VM did not take the interface from the stopped one")
	}
	detach(vm1)
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm1, raw); err != nil {
		t.Fatal(err)
	}
	if got := readHolder(holderFile); got != vm2 || linkIn(t, vm2, VMIfName) == nil {
		t.Fatalf("after the first VM went, the record says %s (want %s)", got, vm2)
	}
	// vm2 is removed (cocoon's vm rm runs the plugin's DEL): the interface is home.
	detach(vm2)
	if got := readHolder(holderFile); got != pod.NetNS || strings.Join(addrsIn(t, pod.NetNS, PodIfName), ",") != strings.Join(podAddrs, ",") {
		t.Fatalf("after vm rm the record says %s, the pod interface has %v (want %v)", got, addrsIn(t, pod.NetNS, PodIfName), podAddrs)
	}

	// The next VM stops and stays: the pod's DEL needs the interface back first.
	vm3 := n.newNS("vm3")
	attach(vm3)
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm3, raw); err != nil {
		t.Fatal(err)
	}
	if got := readHolder(holderFile); got != pod.NetNS || len(addrsIn(t, pod.NetNS, PodIfName)) != len(podAddrs) {
		t.Fatalf("after the reclaim the record says %s", got)
	}
	if err := m.ReclaimFromVM(pod.SandboxID, pod.NetNS, vm3, raw); err != nil {
		t.Fatalf("a repeated reclaim: %v", err)
	}
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if leases := n.leases(); len(leases) != 0 {
		t.Errorf("IP leases left: %v", leases)
	}
	if rules := masqRules(t, n, pod.SandboxID); len(rules) != 0 {
		t.Errorf("masquerade rules left: %q", rules)
	}
	if veths := vethsIn(t, n.node); len(veths) != 0 {
		t.Errorf("veths left on the node: %q", veths)
	}
	// vm3's removal after the pod's DEL finds nothing to give back.
	detach(vm3)
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

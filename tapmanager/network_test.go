package tapmanager

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// debianPlugins is where Debian's containernetworking-plugins installs the reference plugins.
const debianPlugins = "/usr/lib/cni"

// testNetwork is a node namespace with a bridge network configured the way a cluster would, and
// everything it needs under one temporary directory.
type testNetwork struct {
	t       *testing.T
	dir     string
	node    string // the node's namespace: the cluster's bridge lives there
	nets    *NetNS
	cni     *CNI
	confDir string
}

func newTestNetwork(t *testing.T, subnet string) *testNetwork {
	t.Helper()
	testproc.RequireRoot(t, "a network namespace")
	if _, err := os.Stat(filepath.Join(debianPlugins, "bridge")); err != nil {
		t.Fatalf("Debian's CNI plugins are missing (hack/setup.sh installs containernetworking-plugins): %v", err)
	}
	dir := t.TempDir()
	n := &testNetwork{t: t, dir: dir, nets: &NetNS{Dir: filepath.Join(dir, "netns")}, confDir: filepath.Join(dir, "net.d")}
	n.node = n.newNS("node")
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "plugins": [
	  {"type": "bridge", "bridge": "cni0", "isGateway": true,
	   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
	  {"type": "portmap", "capabilities": {"portMappings": true}}]}`, subnet, filepath.Join(dir, "ipam"))
	if err := os.MkdirAll(n.confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.confDir, "10-pods.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n.cni = NewCNI(n.confDir, []string{debianPlugins}, filepath.Join(dir, "cache"), nil)
	return n
}

// newNS makes a namespace that the test removes at its end.
func (n *testNetwork) newNS(name string) string {
	n.t.Helper()
	path := filepath.Join(n.nets.Dir, name)
	if err := n.nets.CreateNetNS(path); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = n.nets.RemoveNetNS(path) })
	return path
}

// inNode runs fn inside the node's namespace, where the cluster's plugins run.
func (n *testNetwork) inNode(fn func() error) {
	n.t.Helper()
	if err := ns.WithNetNSPath(n.node, func(ns.NetNS) error { return fn() }); err != nil {
		n.t.Fatal(err)
	}
}

func (n *testNetwork) pod(name string) Pod {
	return Pod{SandboxID: "sandbox-" + name, NetNS: n.newNS("pod-" + name), Config: &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		PortMappings: []*runtimeapi.PortMapping{{ContainerPort: 80, HostPort: 8081, Protocol: runtimeapi.Protocol_TCP}},
		DnsConfig:    &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"default.svc.cluster.local"}},
	}}
}

func (n *testNetwork) leases() []string {
	entries, _ := os.ReadDir(filepath.Join(n.dir, "ipam", "pods"))
	var ips []string
	for _, e := range entries {
		if strings.Count(e.Name(), ".") == 3 {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

func linkIn(t *testing.T, nsPath, name string) netlink.Link {
	t.Helper()
	var link netlink.Link
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err == nil {
			link = l
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return link
}

func addrsIn(t *testing.T, nsPath, name string) []string {
	t.Helper()
	var out []string
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(link, netlink.FAMILY_V4)
		for _, a := range addrs {
			out = append(out, a.IPNet.String())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestLoadPicksTheFirstLoadableNetwork(t *testing.T) {
	dir := t.TempDir()
	c := NewCNI(dir, []string{debianPlugins}, t.TempDir(), nil)
	if _, err := c.Load(""); err == nil {
		t.Fatal("an empty directory loaded")
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("05-broken.conflist", "{not json")
	write("20-second.conflist", `{"cniVersion":"1.0.0","name":"second","plugins":[{"type":"bridge"}]}`)
	write("10-first.conf", `{"cniVersion":"1.0.0","name":"first","type":"bridge"}`)
	list, err := c.Load("")
	if err != nil || list.Name != "first" {
		t.Fatalf("default network: %v, %v", list, err)
	}
	if list, err := c.Load("second"); err != nil || list.Name != "second" {
		t.Fatalf("named network: %v, %v", list, err)
	}
	if _, err := c.Load("third"); err == nil || !strings.Contains(err.Error(), "third") {
		t.Fatalf("unknown network: %v", err)
	}
}

func TestReadyNeedsConfigAndPlugins(t *testing.T) {
	dir := t.TempDir()
	c := NewCNI(dir, []string{t.TempDir()}, t.TempDir(), nil)
	ctx := context.Background()
	if err := c.Ready(ctx); err == nil {
		t.Fatal("ready without configuration")
	}
	if err := os.WriteFile(filepath.Join(dir, "10-a.conflist"), []byte(`{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); err == nil || !strings.Contains(err.Error(), "not usable") {
		t.Fatalf("ready without plugins: %v", err)
	}
	if err := NewCNI(dir, []string{debianPlugins}, t.TempDir(), nil).Ready(ctx); err != nil {
		t.Fatalf("not ready with Debian's plugins: %v", err)
	}
}

// TestAttachHandsThePodInterfaceOverAndBack walks the interface through a VM's life: the cluster's
// ADD configures it in the pod's namespace, a VM takes it (the plugin's ADD), gives it back (DEL),
// the next VM takes it from a VM that was never reclaimed, and the cluster's DEL releases the IP.
// add runs the cluster's CNI ADD for pod in the node, and returns the network it used and the
// result, raw as cocoon-cri stores it and decoded.
func (n *testNetwork) add(ctx context.Context, pod Pod) (*libcni.NetworkConfigList, []byte, *current.Result) {
	n.t.Helper()
	list, err := n.cni.Load("")
	if err != nil {
		n.t.Fatal(err)
	}
	var raw []byte
	n.inNode(func() error {
		result, err := n.cni.Add(ctx, list, pod)
		if err != nil {
			return err
		}
		raw, err = json.Marshal(result)
		return err
	})
	result, err := DecodeResult(raw)
	if err != nil {
		n.t.Fatal(err)
	}
	return list, raw, result
}

// TestAttachLinksThePodInterfaceToEachVM runs the attach plugin as cocoon does for a pod's VMs: the
// pod interface never leaves the pod's namespace, each VM's namespace gets a pair's end with its
// MAC, frames cross, and vm rm's DEL of the VM it is wired to gives it back its addresses.
func TestAttachLinksThePodInterfaceToEachVM(t *testing.T) {
	n := newTestNetwork(t, "10.77.0.0/24")
	ctx := context.Background()
	pod := n.pod("web")
	list, raw, result := n.add(ctx, pod)
	ips, mac := PodAddresses(result)
	if len(ips) != 1 || !strings.HasPrefix(ips[0], "10.77.0.") || mac == "" {
		t.Fatalf("pod addresses %v, mac %q", ips, mac)
	}
	podAddrs := addrsIn(t, pod.NetNS, PodIfName)
	if len(podAddrs) != 1 {
		t.Fatalf("pod interface addresses %v", podAddrs)
	}
	conf := &attachConf{PodNetNS: pod.NetNS, HolderFile: filepath.Join(n.dir, "holder"), PodResult: raw}
	del := func(vm string) {
		t.Helper()
		if err := runPlugin(t, attachDel, conf, vm); err != nil {
			t.Fatalf("the plugin's DEL in %s: %v", vm, err)
		}
	}

	vm1 := n.newNS("vm1")
	cocoonClones(t, conf, vm1)
	if err := runPlugin(t, attachAdd, conf, vm1); err != nil {
		t.Fatalf("a repeated ADD: %v", err)
	}
	checkWired(t, pod.NetNS, vm1, mac)
	if got := readRecord(conf.HolderFile); got != (holderRecord{At: pod.NetNS, WiredTo: vm1}) {
		t.Fatalf("record %+v", got)
	}
	framesCross(t, n, pod.NetNS, vm1, podAddrs[0], mac)

	// The container restarts: its stopped VM keeps its end, the new one gets its own.
	vm2 := n.newNS("vm2")
	cocoonClones(t, conf, vm2)
	checkWired(t, pod.NetNS, vm2, mac)
	framesCross(t, n, pod.NetNS, vm2, podAddrs[0], mac)
	// The stopped VM's removal leaves the interface to the running one.
	del(vm1)
	if got := readRecord(conf.HolderFile); got != (holderRecord{At: pod.NetNS, WiredTo: vm2}) || len(addrsIn(t, pod.NetNS, PodIfName)) != 0 {
		t.Fatalf("after the first VM's removal: record %+v, addresses %v", got, addrsIn(t, pod.NetNS, PodIfName))
	}
	// The running one's removal gives the interface back what the cluster's CNI gave it.
	for range 2 {
		del(vm2)
	}
	if got := addrsIn(t, pod.NetNS, PodIfName); strings.Join(got, ",") != strings.Join(podAddrs, ",") {
		t.Fatalf("addresses after vm rm %v, want %v", got, podAddrs)
	}
	if q := ingressQdiscs(t, pod.NetNS, PodIfName); q != 0 || readRecord(conf.HolderFile) != (holderRecord{At: pod.NetNS}) {
		t.Fatalf("after vm rm: %d ingress qdiscs, record %+v", q, readRecord(conf.HolderFile))
	}

	// An interface an earlier cocoon-cri moved into a VM's namespace comes back at that VM's
	// removal, as it did then.
	vm3 := n.newNS("vm3")
	if err := moveLink(pod.NetNS, PodIfName, vm3, VMIfName); err != nil {
		t.Fatal(err)
	}
	if err := writeHolder(conf.HolderFile, vm3); err != nil {
		t.Fatal(err)
	}
	del(vm3)
	if got := addrsIn(t, pod.NetNS, PodIfName); strings.Join(got, ",") != strings.Join(podAddrs, ",") {
		t.Fatalf("addresses after the earlier VM's removal %v, want %v", got, podAddrs)
	}

	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if leases := n.leases(); len(leases) != 0 {
		t.Fatalf("IP leases left: %v", leases)
	}
	if linkIn(t, pod.NetNS, PodIfName) != nil {
		t.Fatal("the cluster's DEL left the pod interface")
	}
	// DEL again, DEL with the namespace gone, and DEL with a plain file where it was (a pin a
	// crash cut short between its file and its mount, which the plugins refuse to enter), are fine.
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if err := n.nets.RemoveNetNS(pod.NetNS); err != nil {
		t.Fatal(err)
	}
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if err := os.WriteFile(pod.NetNS, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	n.inNode(func() error { return n.cni.Del(ctx, list.Bytes, pod) })
	if err := n.nets.RemoveNetNS(pod.NetNS); err != nil {
		t.Fatal(err)
	}
	// A VM's removal after its pod's namespace went finds nothing to give back.
	if err := writeRecord(conf.HolderFile, holderRecord{At: pod.NetNS, WiredTo: vm2}); err != nil {
		t.Fatal(err)
	}
	del(vm2)
}

func TestAddPassesKubeletArgsAndCapabilities(t *testing.T) {
	pod := Pod{SandboxID: "sb1", NetNS: "/x", Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "prod", Uid: "u-1"},
		PortMappings: []*runtimeapi.PortMapping{
			{ContainerPort: 80, HostPort: 8080, Protocol: runtimeapi.Protocol_TCP, HostIp: "10.0.0.1"},
			{ContainerPort: 53, HostPort: 5353, Protocol: runtimeapi.Protocol_UDP},
			{ContainerPort: 9090}, // no host port: not a mapping
		},
		DnsConfig: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"svc.local"}, Options: []string{"ndots:5"}},
	}}
	rc := pod.runtimeConf()
	args := map[string]string{}
	for _, kv := range rc.Args {
		args[kv[0]] = kv[1]
	}
	want := map[string]string{"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "prod", "K8S_POD_NAME": "web", "K8S_POD_INFRA_CONTAINER_ID": "sb1", "K8S_POD_UID": "u-1"}
	for k, v := range want {
		if args[k] != v {
			t.Errorf("CNI_ARGS %s=%q, want %q", k, args[k], v)
		}
	}
	caps, err := json.Marshal(rc.CapabilityArgs)
	if err != nil {
		t.Fatal(err)
	}
	wantCaps := `{"dns":{"servers":["10.96.0.10"],"searches":["svc.local"],"options":["ndots:5"]},` +
		`"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":"10.0.0.1"},{"hostPort":5353,"containerPort":53,"protocol":"udp"}]}`
	if string(caps) != wantCaps {
		t.Fatalf("capability args\n%s\nwant\n%s", caps, wantCaps)
	}
	if rc.IfName != "eth0" || rc.ContainerID != "sb1" {
		t.Fatalf("runtime conf %+v", rc)
	}
}

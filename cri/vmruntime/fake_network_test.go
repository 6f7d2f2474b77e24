package vmruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// fakeNetwork is the pod network in memory, behind the PodNetwork seam: namespaces are paths in a
// set, a CNI ADD leases the next address of 10.88.0.0/16 to the sandbox until its DEL, and
// cocoon's per-sandbox configuration is the result it was handed. Like tapmanager, removals and
// DEL are safe to repeat, and ADD needs the namespace. Every call that can fail is recorded and
// can be made to fail (faults).
//
// The pod interface is where the namespace path in ifaces says. The fake cocoon runs the attach
// plugin (attachAdd, attachDel) as cocoon does for the VMs of a sandbox. As with the cluster's
// real plugins, a DEL that does not find the interface in the pod's namespace leaves what the
// plugins set up on it (unreleased), and an interface goes with the namespace it is in. The attach
// plugin and a pool VM's hand-over leave the interface home but wired to the VM (wired), without
// its addresses: a DEL before RestorePodInterface or the VM's removal misses them as it would a
// moved interface.
type fakeNetwork struct {
	faults

	mu       sync.Mutex
	networks []*libcni.NetworkConfigList // the first is the node's default
	readyErr error
	netns    map[string]bool            // pinned namespaces, by path
	leases   map[string]string          // CNI ADD done and not yet deleted: sandbox ID -> IP
	cocoon   map[string]json.RawMessage // cocoon's configuration, by sandbox ID: the pod's CNI result
	serial   int
	watches  map[*fakeTraffic]bool // open traffic watches
	// handedOver names, by VM namespace, the sandbox whose pod interface a pool VM was given.
	handedOver map[string]string
	ifaces     map[string]string // sandbox ID -> the namespace its pod interface is in
	wired      map[string]string // sandbox ID -> the VM namespace its interface at home is wired to
	unreleased map[string]bool   // sandbox IDs whose DEL missed the pod interface
}

// fakeTraffic is a watch of the pod's traffic in a VM's namespace; the test sends it packets.
type fakeTraffic struct {
	n       *fakeNetwork
	netns   string
	seen    bool          // under n.mu
	waiting int           // WaitForUse calls in flight, under n.mu
	packet  chan struct{} // a packet for a WaitForUse
}

func (t *fakeTraffic) Seen() (bool, error) {
	t.n.mu.Lock()
	defer t.n.mu.Unlock()
	seen := t.seen
	t.seen = false
	return seen, nil
}

func (t *fakeTraffic) WaitForUse(ctx context.Context) error {
	t.n.mu.Lock()
	select {
	case <-t.packet: // before the call: it does not count
	default:
	}
	t.waiting++
	t.n.mu.Unlock()
	defer func() {
		t.n.mu.Lock()
		t.waiting--
		t.n.mu.Unlock()
	}()
	select {
	case <-t.packet:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *fakeTraffic) Close() error {
	t.n.mu.Lock()
	defer t.n.mu.Unlock()
	delete(t.n.watches, t)
	return nil
}

// WatchTraffic opens a watch on the pod interface in a VM's namespace.
func (n *fakeNetwork) WatchTraffic(vmNetNS string, _ net.IP) (tapmanager.Traffic, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("WatchTraffic", vmNetNS); err != nil {
		return nil, err
	}
	t := &fakeTraffic{n: n, netns: vmNetNS, packet: make(chan struct{}, 1)}
	if n.watches == nil {
		n.watches = map[*fakeTraffic]bool{}
	}
	n.watches[t] = true
	return t, nil
}

// packet passes a packet of the pod's through the VM namespace's open watches.
func (n *fakeNetwork) packet(vmNetNS string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for t := range n.watches {
		if t.netns == vmNetNS {
			t.seen = true
			select {
			case t.packet <- struct{}{}:
			default:
			}
		}
	}
}

// waitingFor counts the waits for the pod's traffic in flight in a VM's namespace.
func (n *fakeNetwork) waitingFor(vmNetNS string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	waiting := 0
	for t := range n.watches {
		if t.netns == vmNetNS {
			waiting += t.waiting
		}
	}
	return waiting
}

// openWatches counts the traffic watches not closed.
func (n *fakeNetwork) openWatches() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.watches)
}

// fakeNetDir stands for the directories the fake's paths are under.
const fakeNetDir = "/fake-net"

func newFakeNetwork(names ...string) *fakeNetwork {
	n := &fakeNetwork{
		netns: map[string]bool{}, leases: map[string]string{}, cocoon: map[string]json.RawMessage{},
		handedOver: map[string]string{}, ifaces: map[string]string{}, wired: map[string]string{}, unreleased: map[string]bool{},
	}
	if len(names) == 0 {
		names = []string{"podnet"}
	}
	for _, name := range names {
		list, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":"bridge"}]}`, name))
		if err != nil {
			panic(err)
		}
		n.networks = append(n.networks, list)
	}
	return n
}

var _ PodNetwork = (*fakeNetwork)(nil)

// --- test controls and views ---

// held lists what the network holds for pods, sorted: "netns PATH", "lease SANDBOX IP",
// "cocoon SANDBOX", "interface SANDBOX NETNS", "unreleased SANDBOX". Empty when every pod is gone
// without a leak.
func (n *fakeNetwork) held() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for path := range n.netns {
		out = append(out, "netns "+path)
	}
	for id, ip := range n.leases {
		out = append(out, "lease "+id+" "+ip)
	}
	for id := range n.cocoon {
		out = append(out, "cocoon "+id)
	}
	for id, at := range n.ifaces {
		out = append(out, "interface "+id+" "+at)
	}
	for id, vm := range n.wired {
		out = append(out, "wired "+id+" "+vm)
	}
	for id := range n.unreleased {
		out = append(out, "unreleased "+id)
	}
	slices.Sort(out)
	return out
}

// addForeign leaves the network pieces of a sandbox that no record names (a state database
// restored from a backup): its namespace, its lease and cocoon's configuration.
func (n *fakeNetwork) addForeign(sandboxID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.netns[n.netNSPath(sandboxID)] = true
	n.leases[sandboxID] = "10.88.255.254"
	n.cocoon[sandboxID] = json.RawMessage(`{"cniVersion":"1.0.0"}`)
}

// --- the seam ---

func (n *fakeNetwork) netNSPath(sandboxID string) string {
	return fakeNetDir + "/netns/cocoon-cri-" + sandboxID
}

func (n *fakeNetwork) NetNSPath(sandboxID string) string { return n.netNSPath(sandboxID) }

func (n *fakeNetwork) CreateNetNS(path string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("CreateNetNS", path); err != nil {
		return err
	}
	if n.netns[path] {
		return fmt.Errorf("pin network namespace %s: file exists", path)
	}
	n.netns[path] = true
	return nil
}

func (n *fakeNetwork) RemoveNetNS(path string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("RemoveNetNS", path); err != nil {
		return err
	}
	delete(n.netns, path)
	for id, at := range n.ifaces {
		if at == path {
			delete(n.ifaces, id)
			delete(n.wired, id)
		}
	}
	return nil
}

func (n *fakeNetwork) Load(name string) (*libcni.NetworkConfigList, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("Load", name); err != nil {
		return nil, err
	}
	if len(n.networks) == 0 {
		return nil, fmt.Errorf("no loadable CNI configuration in %s/net.d: %w", fakeNetDir, tapmanager.ErrNoNetwork)
	}
	if name == "" {
		return n.networks[0], nil
	}
	var found []string
	for _, list := range n.networks {
		if list.Name == name {
			return list, nil
		}
		found = append(found, list.Name)
	}
	return nil, &tapmanager.UnknownNetworkError{Name: name, Dir: fakeNetDir + "/net.d", Found: found}
}

func (n *fakeNetwork) Ready(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("Ready"); err != nil {
		return err
	}
	return n.readyErr
}

// Add leases the sandbox an address and reports the pod interface in its namespace.
func (n *fakeNetwork) Add(_ context.Context, list *libcni.NetworkConfigList, pod tapmanager.Pod) (*current.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("Add", pod.SandboxID, list.Name); err != nil {
		return nil, err
	}
	if !n.netns[pod.NetNS] {
		return nil, fmt.Errorf("CNI ADD to network %q: no network namespace %s", list.Name, pod.NetNS)
	}
	if _, ok := n.leases[pod.SandboxID]; ok {
		return nil, fmt.Errorf("CNI ADD to network %q: sandbox %s is attached already", list.Name, pod.SandboxID)
	}
	n.serial++
	ip := net.IPv4(10, 88, byte(n.serial>>8), byte(n.serial))
	n.leases[pod.SandboxID] = ip.String()
	n.ifaces[pod.SandboxID] = pod.NetNS
	podIf := 1
	return &current.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*current.Interface{
			{Name: "veth" + pod.SandboxID[:min(8, len(pod.SandboxID))], Mac: "0a:58:0a:58:00:01"},
			{Name: tapmanager.PodIfName, Mac: fmt.Sprintf("0a:58:0a:58:%02x:%02x", byte(n.serial>>8), byte(n.serial)), Sandbox: pod.NetNS},
		},
		IPs: []*current.IPConfig{{
			Interface: &podIf,
			Address:   net.IPNet{IP: ip, Mask: net.CIDRMask(16, 32)},
			Gateway:   net.IPv4(10, 88, 0, 1),
		}},
	}, nil
}

// Del releases the sandbox's lease, whether or not it holds one, and the pod interface if it is in
// the pod's namespace.
func (n *fakeNetwork) Del(_ context.Context, confList []byte, pod tapmanager.Pod) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("Del", pod.SandboxID); err != nil {
		return err
	}
	if _, err := libcni.ConfListFromBytes(confList); err != nil {
		return fmt.Errorf("read the recorded CNI configuration: %w", err)
	}
	delete(n.leases, pod.SandboxID)
	switch at := n.ifaces[pod.SandboxID]; {
	case at == pod.NetNS && n.wired[pod.SandboxID] != "":
		delete(n.ifaces, pod.SandboxID)
		delete(n.wired, pod.SandboxID)
		n.unreleased[pod.SandboxID] = true
	case at == pod.NetNS:
		delete(n.ifaces, pod.SandboxID)
		delete(n.unreleased, pod.SandboxID)
	case at == "":
	default:
		n.unreleased[pod.SandboxID] = true
	}
	return nil
}

func (n *fakeNetwork) CocoonConfDir(sandboxID string) string {
	return fakeNetDir + "/pods/" + sandboxID + "/net.d"
}

func (n *fakeNetwork) PluginDir() string { return fakeNetDir + "/bin" }

func (n *fakeNetwork) PrepareCocoon(sandboxID, _ string, result json.RawMessage) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("PrepareCocoon", sandboxID); err != nil {
		return err
	}
	if _, err := tapmanager.DecodeResult(result); err != nil {
		return fmt.Errorf("the pod's CNI result: %w", err)
	}
	n.cocoon[sandboxID] = result
	return nil
}

func (n *fakeNetwork) RemoveCocoon(sandboxID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("RemoveCocoon", sandboxID); err != nil {
		return err
	}
	delete(n.cocoon, sandboxID)
	return nil
}

// PreparePoolVM pins the pool VM's namespace and writes cocoon's configuration for it, as for a
// sandbox, with a placeholder result.
func (n *fakeNetwork) PreparePoolVM(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("PreparePoolVM", id); err != nil {
		return err
	}
	n.netns[n.netNSPath(id)] = true
	n.cocoon[id] = json.RawMessage(`{"cniVersion":"1.0.0","ips":[{"address":"192.0.2.1/32"}]}`)
	n.ifaces[id] = n.netNSPath(id) // the placeholder
	return nil
}

func (n *fakeNetwork) RemovePoolVM(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("RemovePoolVM", id); err != nil {
		return err
	}
	delete(n.netns, n.netNSPath(id))
	delete(n.cocoon, id)
	delete(n.ifaces, id)
	delete(n.wired, id)
	return nil
}

// HandOver needs the sandbox's network and a VM namespace; which sandbox's interface each VM
// namespace got is kept for the tests. An interface a previous VM holds comes home first.
func (n *fakeNetwork) HandOver(sandboxID, podNetNS, vmNetNS string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("HandOver", sandboxID, vmNetNS); err != nil {
		return err
	}
	if !n.netns[podNetNS] || n.cocoon[sandboxID] == nil || vmNetNS == "" || n.ifaces[sandboxID] == "" {
		return fmt.Errorf("hand over %s's interface to %q: the sandbox has no network", sandboxID, vmNetNS)
	}
	n.handedOver[vmNetNS] = sandboxID
	n.ifaces[sandboxID], n.wired[sandboxID] = podNetNS, vmNetNS
	return nil
}

// RestorePodInterface gives an interface a hand-over wired its addresses back.
func (n *fakeNetwork) RestorePodInterface(sandboxID, podNetNS string, result json.RawMessage) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("RestorePodInterface", sandboxID); err != nil {
		return err
	}
	if _, err := tapmanager.DecodeResult(result); err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	if n.ifaces[sandboxID] == podNetNS {
		delete(n.wired, sandboxID)
	}
	return nil
}

// wiredTo is the VM namespace the sandbox's interface at home is wired to; "" when none.
func (n *fakeNetwork) wiredTo(sandboxID string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wired[sandboxID]
}

// interfaceOf is the sandbox whose pod interface a VM namespace was handed.
func (n *fakeNetwork) interfaceOf(vmNetNS string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.handedOver[vmNetNS]
}

// ReclaimFromVM checks the result it is handed and moves the pod interface home if the VM's
// namespace holds it.
func (n *fakeNetwork) ReclaimFromVM(sandboxID, podNetNS, vmNetNS string, result json.RawMessage) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("ReclaimFromVM", sandboxID, vmNetNS); err != nil {
		return err
	}
	if _, err := tapmanager.DecodeResult(result); err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	if n.ifaces[sandboxID] == vmNetNS {
		n.ifaces[sandboxID] = podNetNS
	}
	return nil
}

// sandboxOfConfDir is the sandbox whose cocoon configuration is in dir (CocoonConfDir).
func sandboxOfConfDir(dir string) string {
	return strings.TrimSuffix(strings.TrimPrefix(dir, fakeNetDir+"/pods/"), "/net.d")
}

// attachAdd is the attach plugin's ADD for a new VM of the sandbox configured in confDir: the
// interface, brought home if a VM holds it, is wired to the new VM. A sandbox the fake never
// attached is left alone.
func (n *fakeNetwork) attachAdd(confDir, vmNetNS string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := sandboxOfConfDir(confDir)
	switch {
	case n.ifaces[id] != "":
		n.ifaces[id], n.wired[id] = n.netNSPath(id), vmNetNS
	case n.cocoon[id] != nil:
		return fmt.Errorf("the pod interface %s of sandbox %s is neither in its namespace nor held by a VM", tapmanager.PodIfName, id)
	}
	return nil
}

// attachDel is the plugin's DEL as vm rm runs it: the interface wired to that VM gets its
// addresses back; one a VM holds goes back to the pod's namespace, or, with that gone, with the
// VM's.
func (n *fakeNetwork) attachDel(confDir, vmNetNS string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := sandboxOfConfDir(confDir)
	if n.wired[id] == vmNetNS {
		delete(n.wired, id)
		return
	}
	if n.ifaces[id] != vmNetNS {
		return
	}
	if pod := n.netNSPath(id); n.netns[pod] {
		n.ifaces[id] = pod
	} else {
		delete(n.ifaces, id)
	}
}

// servedBy is the VM namespace the sandbox's pod interface serves: the one it is wired to, or the
// one that holds it; its own namespace when none.
func (n *fakeNetwork) servedBy(sandboxID string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if vm := n.wired[sandboxID]; vm != "" {
		return vm
	}
	return n.ifaces[sandboxID]
}

// interfaceAt is the namespace the sandbox's pod interface is in; "" when it is gone.
func (n *fakeNetwork) interfaceAt(sandboxID string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ifaces[sandboxID]
}

func (n *fakeNetwork) PodInterfaceCounters(sandboxID, podNetNS string) (vmstats.Interface, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("PodInterfaceCounters", podNetNS); err != nil {
		return vmstats.Interface{}, err
	}
	if n.ifaces[sandboxID] == "" {
		return vmstats.Interface{}, fmt.Errorf("counters of %s in %s: no such device", tapmanager.PodIfName, podNetNS)
	}
	return vmstats.Interface{Name: tapmanager.PodIfName}, nil
}

// RemoveLeftovers removes the pieces of every sandbox not in known: namespaces, leases and
// cocoon's configuration.
func (n *fakeNetwork) RemoveLeftovers(_ context.Context, known map[string]bool) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.call("RemoveLeftovers", strings.Join(slices.Sorted(maps.Keys(known)), ",")); err != nil {
		return nil, err
	}
	var removed []string
	for path := range n.netns {
		id := strings.TrimPrefix(path, fakeNetDir+"/netns/cocoon-cri-")
		if !known[id] {
			delete(n.netns, path)
			removed = append(removed, "netns "+path)
		}
	}
	for id := range n.leases {
		if !known[id] {
			delete(n.leases, id)
			removed = append(removed, "lease of "+id)
		}
	}
	for id := range n.cocoon {
		if !known[id] {
			delete(n.cocoon, id)
			removed = append(removed, "cocoon configuration of "+id)
		}
	}
	slices.Sort(removed)
	return removed, nil
}

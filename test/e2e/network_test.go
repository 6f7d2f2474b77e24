package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/harness"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// guestPort is where the simulated guest answers with its name and address.
const guestPort = 8080

// withReachableImage imports the image the reachability tests boot: a cloud image, whose guest
// takes the pod address from cocoon at first boot. (A clone keeps its snapshot's guest network
// configuration until the guest is reconfigured: see docs/networking.md.)
func (n *node) withReachableImage() {
	n.ImportImage(cloudRef, n.cloudImage("cloud"))
}

// podIP is the sandbox's primary IP as crictl inspectp reports it.
func (n *node) podIP(podID string) string {
	n.t.Helper()
	ip, _ := field(n.inspect("inspectp", podID), "status", "network", "ip").(string)
	if ip == "" {
		n.t.Fatalf("sandbox %s has no IP", podID)
	}
	return ip
}

// dialFromNode connects from the node's namespace and returns the first line the peer sends.
func (n *node) dialFromNode(addr string) string {
	n.t.Helper()
	return n.answerFromNode(addr, func(string) bool { return true })
}

// answerFromNode dials addr from the node until the peer's first line satisfies want (the guest is
// set up in the background after StartContainer), and returns the last line read.
func (n *node) answerFromNode(addr string, want func(string) bool) string {
	n.t.Helper()
	var line string
	n.InNode(func() error {
		var err error
		// Generous: a real kernel under software emulation boots in seconds, and in minutes on a busy
		// machine (test/cocoonsim/qemu allows its boot three).
		deadline := time.Now().Add(3 * time.Minute)
		for {
			line, err = readLine(addr)
			if (err == nil && want(line)) || time.Now().After(deadline) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	return line
}

// guestAnswer waits for the guest at addr to answer with hostname and ip.
func (n *node) guestAnswer(addr, hostname, ip string) string {
	n.t.Helper()
	want := hostname + " " + ip + "\n"
	return n.answerFromNode(addr, func(line string) bool { return line == want })
}

func readLine(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(conn).ReadString('\n')
}

// neighbourMAC is the hardware address the node learned for ip on the pod bridge.
func (n *node) neighbourMAC(ip string) string {
	n.t.Helper()
	var mac string
	n.InNode(func() error {
		neighs, err := netlink.NeighList(0, netlink.FAMILY_V4)
		for _, nb := range neighs {
			if nb.IP.String() == ip && nb.HardwareAddr != nil {
				mac = nb.HardwareAddr.String()
			}
		}
		return err
	})
	return mac
}

// TestPodIPReachesTheGuest: the guest answers at the pod IP, with the pod interface's MAC.
func TestPodIPReachesTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withReachableImage()
	pod := n.podConfig("web", "uid-web")
	pod.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10", "10.96.0.11"}, Searches: []string{"default.svc.cluster.local"}}
	podFile := n.configFile("pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("ctr.json", containerConfig("app", cloudRef)), podFile)
	n.mustCrictl("start", ctrID)
	ip := n.podIP(podID)
	if _, subnet, _ := net.ParseCIDR(harness.NodeSubnet); !subnet.Contains(net.ParseIP(ip)) {
		t.Fatalf("pod IP %s is not in the node's pod network %s", ip, harness.NodeSubnet)
	}
	// The guest answers with its hostname, which cocoon-cri set to the pod's.
	line := n.guestAnswer(fmt.Sprintf("%s:%d", ip, guestPort), "web", ip)
	if line != "web "+ip+"\n" {
		t.Fatalf("the guest at %s answered %q, want the pod's hostname and IP", ip, line)
	}
	vmName, _ := field(n.inspect("inspect", ctrID), "info", "vm", "name").(string)
	podMAC, _ := field(n.inspect("inspectp", podID), "info", "network", "mac").(string)
	if podMAC == "" || n.neighbourMAC(ip) != podMAC {
		t.Fatalf("the node sees %s at %q, the pod interface has %q", ip, n.neighbourMAC(ip), podMAC)
	}
	vm, err := n.vm(vmName)
	if err != nil {
		t.Fatal(err)
	}
	if len(vm.NetworkConfigs) != 1 || vm.NetworkConfigs[0].Mac != podMAC || vm.NetworkConfigs[0].Network == nil || vm.NetworkConfigs[0].Network.IP != ip {
		t.Fatalf("cocoon's view of the VM NIC: %+v", vm.NetworkConfigs)
	}
	// The guest's resolvers are the pod's: cocoon put them in the guest's cloud-init data.
	if dns := guestDNS(t, vm); strings.Join(dns, ",") != "10.96.0.10,10.96.0.11" {
		t.Fatalf("guest DNS servers %v, want the pod's", dns)
	}
}

// guestDNS reads the DNS servers cocoon gave a cloud-image VM's NIC in its cloud-init seed: the
// nameservers of the network-config entry that matches the NIC's MAC.
func guestDNS(t *testing.T, vm *cocoon.VM) []string {
	t.Helper()
	for _, sc := range vm.StorageConfigs {
		if sc.Role != cocoon.StorageRoleCidata {
			continue
		}
		files, err := cocoonsim.CidataFiles(sc.Path)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Ethernets map[string]struct {
				Match struct {
					MACAddress string `json:"macaddress"`
				} `json:"match"`
				Nameservers struct {
					Addresses []string `json:"addresses"`
				} `json:"nameservers"`
			} `json:"ethernets"`
		}
		if err := yaml.Unmarshal(files["network-config"], &cfg); err != nil {
			t.Fatalf("cidata %s: network-config: %v", sc.Path, err)
		}
		for _, e := range cfg.Ethernets {
			if strings.EqualFold(e.Match.MACAddress, vm.NetworkConfigs[0].Mac) {
				return e.Nameservers.Addresses
			}
		}
		t.Fatalf("cidata %s: no network-config entry for %s:\n%s", sc.Path, vm.NetworkConfigs[0].Mac, files["network-config"])
	}
	t.Fatalf("VM %s has no cloud-init data", vm.ID)
	return nil
}

// TestRestartedContainerKeepsThePodAddress: a new container in the same pod (the kubelet's
// restart) gets the interface back from the stopped one: same IP, same MAC.
func TestRestartedContainerKeepsThePodAddress(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withReachableImage()
	podID, first, podFile := n.runningPod("web", cloudRef)
	ip := n.podIP(podID)
	oldPID := n.vmPID(first)
	n.mustCrictl("stop", "--timeout", "5", first)
	if testproc.Running(oldPID) {
		t.Fatal("the first VM still runs after its stop")
	}
	second := n.mustCrictl("create", "--no-pull", podID, n.configFile("again.json", containerConfig("app2", cloudRef)), podFile)
	n.mustCrictl("start", second)
	// The first VM is off: the answer at the pod IP is the second one's.
	if line := n.guestAnswer(fmt.Sprintf("%s:%d", ip, guestPort), "web", ip); line != "web "+ip+"\n" {
		t.Fatalf("the pod IP answered %q", line)
	}
	// The exited VM can go while the new one keeps the interface.
	n.mustCrictl("rm", first)
	if line := n.guestAnswer(fmt.Sprintf("%s:%d", ip, guestPort), "web", ip); line != "web "+ip+"\n" {
		t.Fatalf("after removing the old container the pod IP answered %q", line)
	}
}

// TestHostPortReachesTheGuest: a hostPort mapping on the node reaches the guest (portmap).
func TestHostPortReachesTheGuest(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withReachableImage()
	pod := n.podConfig("web", "uid-web")
	pod.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: guestPort, HostPort: 30080}}
	podFile := n.configFile("pod.json", pod)
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	ctrID := n.mustCrictl("create", "--no-pull", podID, n.configFile("ctr.json", containerConfig("app", cloudRef)), podFile)
	n.mustCrictl("start", ctrID)
	if line := n.guestAnswer(harness.NodeGateway+":30080", "web", n.podIP(podID)); line != "web "+n.podIP(podID)+"\n" {
		t.Fatalf("host port 30080 answered %q, want the guest", line)
	}
	n.mustCrictl("rmp", "--force", podID)
	if rules := n.iptablesNAT(); strings.Contains(rules, "30080") {
		t.Fatalf("the host port's rules outlived the pod:\n%s", rules)
	}
}

func (n *node) iptablesNAT() string {
	n.t.Helper()
	var out []byte
	n.InNode(func() error {
		var err error
		out, err = execOutput("iptables", "-t", "nat", "-S")
		return err
	})
	return string(out)
}

// TestNetworkReadyFollowsTheCNIConfiguration: NetworkReady is false, with a reason, while the node
// has no network configuration, pods are refused meanwhile, and it turns true when one appears.
func TestNetworkReadyFollowsTheCNIConfiguration(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	conf := filepath.Join(n.CNIConf, "10-pods.conflist")
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	n.waitNetworkReady(false)
	n.crictlFails("FailedPrecondition", "runp", "--runtime", "cocoon", n.configFile("pod.json", n.podConfig("early", "uid-e")))
	if len(n.netns()) != 0 {
		t.Fatalf("a refused sandbox left namespaces: %v", n.netns())
	}
	if err := os.WriteFile(conf, data, 0o644); err != nil {
		t.Fatal(err)
	}
	n.waitNetworkReady(true)
	n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("pod.json", n.podConfig("early", "uid-e")))
}

func (n *node) waitNetworkReady(want bool) {
	n.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, reason := n.networkCondition()
		if ready == want && (want || reason == "NetworkPluginNotReady") {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("NetworkReady stayed %v (reason %q), want %v", ready, reason, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (n *node) networkCondition() (bool, string) {
	n.t.Helper()
	c, ok := n.conditions()["NetworkReady"]
	if !ok {
		n.t.Fatal("no NetworkReady condition")
	}
	return c.Status, c.Reason
}

// condition is a runtime condition as crictl info prints it.
type condition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// runtimeInfo is the part of crictl info the tests read.
type runtimeInfo struct {
	Status struct {
		Conditions []condition `json:"conditions"`
	} `json:"status"`
	RuntimeHandlers []struct {
		Name string `json:"name"`
	} `json:"runtimeHandlers"`
}

func (n *node) info() runtimeInfo {
	n.t.Helper()
	var info runtimeInfo
	if err := json.Unmarshal([]byte(n.mustCrictl("info", "-o", "json")), &info); err != nil {
		n.t.Fatal(err)
	}
	return info
}

// conditions are the runtime's conditions by type.
func (n *node) conditions() map[string]condition {
	n.t.Helper()
	out := map[string]condition{}
	for _, c := range n.info().Status.Conditions {
		out[c.Type] = c
	}
	return out
}

// leftovers is what a removed pod must not leave on the node.
func (n *node) leftovers() []string {
	n.t.Helper()
	var left []string
	left = append(left, n.netns()...)
	entries, _ := os.ReadDir(filepath.Join(n.IPAMDir, "pods"))
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			left = append(left, "lease "+e.Name())
		}
	}
	n.InNode(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Type() == "veth" || l.Type() == "tuntap" {
				left = append(left, "link "+l.Attrs().Name)
			}
		}
		return err
	})
	cache, _ := filepath.Glob(filepath.Join(n.StateDir, "network", "cache", "results", "*"))
	for _, c := range cache {
		left = append(left, "cni cache "+filepath.Base(c))
	}
	pods, _ := os.ReadDir(filepath.Join(n.StateDir, "network", "pods"))
	for _, p := range pods {
		left = append(left, "cocoon network config "+p.Name())
	}
	return left
}

// TestManyPodsLeaveNoNetworkBehind creates and removes 20 pods: no namespace, veth, TAP, IP lease
// or CNI cache entry survives. Some go the kubelet's way (the container stopped, then the pod):
// the stopped VM keeps the pod interface, and the pod's CNI DEL must still find it and delete its
// veth then, not only when the pod's namespace goes.
func TestManyPodsLeaveNoNetworkBehind(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	// Ten at a time: ten VMs run together, then go.
	for batch := range 2 {
		var pods, ctrs []string
		for i := range 10 {
			podID, ctrID, _ := n.runningPod(fmt.Sprintf("p%d-%d", batch, i), snapRef)
			pods = append(pods, podID)
			ctrs = append(ctrs, ctrID)
		}
		if got := len(n.vms()); got != 10 {
			t.Fatalf("%d VMs running, want 10", got)
		}
		listed := strings.Fields(n.mustCrictl("pods", "-q"))
		slices.Sort(listed)
		slices.Sort(pods)
		if !slices.Equal(listed, pods) {
			t.Fatalf("crictl pods = %v, want %v", listed, pods)
		}
		for i, podID := range pods {
			if i%4 == 1 {
				before := len(n.nodeVeths())
				n.mustCrictl("stop", "--timeout", "0", ctrs[i])
				n.mustCrictl("stopp", podID)
				if after := n.nodeVeths(); len(after) != before-1 {
					t.Fatalf("the node has %d veths after the pod's stop, had %d: %v", len(after), before, after)
				}
			}
			if i%2 == 0 {
				n.mustCrictl("stopp", podID)
			}
			n.mustCrictl("rmp", "--force", podID)
		}
	}
	if left := n.leftovers(); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// nodeVeths are the node's ends of the pods' veths.
func (n *node) nodeVeths() []string {
	n.t.Helper()
	var veths []string
	n.InNode(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Type() == "veth" {
				veths = append(veths, l.Attrs().Name)
			}
		}
		return err
	})
	return veths
}

// TestCrashDuringRunPodSandboxLeaksNothing kills cocoon-cri at every point inside RunPodSandbox,
// restarts it, and retries the way the kubelet does: the retry succeeds, and once the pod is
// removed nothing is left.
func TestCrashDuringRunPodSandboxLeaksNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withSnapshot()
	for i, point := range faultpoint.All {
		n.Stop()
		n.Env = []string{faultpoint.EnvVar + "=" + point}
		n.Start()
		podFile := n.configFile(fmt.Sprintf("crash%d.json", i), n.podConfig(fmt.Sprintf("crash%d", i), fmt.Sprintf("uid-crash%d", i)))
		if _, err := n.crictl("runp", "--runtime", "cocoon", podFile); err == nil {
			t.Fatalf("%s: RunPodSandbox survived its crash point", point)
		}
		if !n.Died(30 * time.Second) {
			t.Fatalf("%s: cocoon-cri did not die at its crash point", point)
		}
		n.Env = nil
		n.Start()
		podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
		if got := len(n.netns()); got != 1 {
			t.Fatalf("%s: %d namespaces after the retry, want the one of the new sandbox: %v", point, got, n.netns())
		}
		n.mustCrictl("rmp", "--force", podID)
		if left := n.leftovers(); len(left) != 0 {
			t.Fatalf("%s: left behind: %v", point, left)
		}
	}
}

// TestTwoPodsReachEachOther: a guest reaches another pod's guest at its pod IP, across the
// cluster's bridge.
func TestTwoPodsReachEachOther(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.withReachableImage()
	_, ctrA, _ := n.runningPod("alpha", cloudRef)
	podB, _, _ := n.runningPod("beta", cloudRef)
	ipB := n.podIP(podB)

	guestA, err := cocoonsim.GuestOSPID(n.vmPID(ctrA))
	if err != nil {
		t.Fatal(err)
	}
	var line string
	deadline := time.Now().Add(30 * time.Second)
	err = ns.WithNetNSPath(fmt.Sprintf("/proc/%d/ns/net", guestA), func(ns.NetNS) error {
		for {
			var err error
			if line, err = readLine(fmt.Sprintf("%s:%d", ipB, guestPort)); (err == nil && line == "beta "+ipB+"\n") || time.Now().After(deadline) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatalf("pod alpha's guest cannot reach pod beta at %s: %v", ipB, err)
	}
	if line != "beta "+ipB+"\n" {
		t.Fatalf("pod beta's IP answered %q", line)
	}
}

// TestPodsPickOnlyAllowedNetworks: the network annotation joins a network of --cni-conf-dir that
// the operator allows (--allowed-networks); one that is not allowed (a management network), and
// one the node does not have, are refused with InvalidArgument saying which are allowed, or that
// the network is missing.
func TestPodsPickOnlyAllowedNetworks(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--allowed-networks", "storage,ghost")
	for file, net := range map[string]struct{ name, bridge, subnet string }{
		"net.d/20-storage.conflist": {"storage", "cni1", "10.89.0.0/24"},
		"net.d/30-admin.conflist":   {"admin", "cni2", "10.90.0.0/24"},
	} {
		n.WriteFile(file, []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}]}`, net.name, net.bridge, net.subnet, n.IPAMDir)))
	}
	onNetwork := func(name string) *runtimeapi.PodSandboxConfig {
		pod := n.podConfig("on-"+name, "uid-on-"+name)
		pod.Annotations = map[string]string{"cocoonset.cocoonstack.io/network": name}
		return pod
	}
	podID := n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("storage.json", onNetwork("storage")))
	if ip := n.podIP(podID); !strings.HasPrefix(ip, "10.89.0.") {
		t.Fatalf("a pod on the allowed network has IP %q", ip)
	}
	if ip := n.podIP(n.mustCrictl("runp", "--runtime", "cocoon", n.configFile("pods.json", onNetwork("pods")))); !strings.HasPrefix(ip, "10.88.0.") {
		t.Fatalf("a pod naming the default network has IP %q", ip)
	}
	for _, name := range []string{"admin", "nosuch"} {
		msg := n.crictlFails("InvalidArgument", "runp", "--runtime", "cocoon", n.configFile(name+".json", onNetwork(name)))
		if !strings.Contains(msg, "--allowed-networks") {
			t.Fatalf("network %s: %s", name, msg)
		}
	}
	if msg := n.crictlFails("InvalidArgument", "runp", "--runtime", "cocoon", n.configFile("ghost.json", onNetwork("ghost"))); !strings.Contains(msg, "no CNI network named") || !strings.Contains(msg, "ghost") {
		t.Fatalf("an allowed network the node lacks: %s", msg)
	}
}

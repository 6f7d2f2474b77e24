package cocoonsim_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

func TestCNIRunWiresGuestIntoItsOwnNetns(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	vm := lab.runVM("img", "web")

	if len(vm.NetworkConfigs) != 1 {
		t.Fatalf("network_configs: %+v", vm.NetworkConfigs)
	}
	nc := vm.NetworkConfigs[0]
	wantNetns := filepath.Join(lab.netnsDir, "cocoon-"+vm.ID)
	if nc.Tap != "tap"+vm.ID[:8]+"-0" || nc.Backend != "cni" || nc.NetnsPath != wantNetns || nc.NumQueues != 4 || nc.QueueSize != 512 || nc.BridgeDev != "" {
		t.Fatalf("network_configs[0]: %+v", nc)
	}
	if nc.Network == nil || !strings.HasPrefix(nc.Network.IP, "10.99.0.") || nc.Network.Gateway != labGateway || nc.Network.Prefix != 24 {
		t.Fatalf("network_configs[0].network: %+v", nc.Network)
	}
	if vm.Config.Network != labNetwork {
		t.Fatalf("config.network %q: cocoon records the conflist it used", vm.Config.Network)
	}
	if !sameNetns(t, vm.PID, nc.NetnsPath) {
		t.Fatal("the hypervisor does not run inside the VM's netns")
	}
	lab.checkNetworkIndex(vm.ID, map[string]string{"eth0": nc.Network.IP})
	lab.checkTCRedirect(nc)

	ip := nc.Network.IP
	lab.mustProbe(lab.ns, ip, "web "+ip)
	// One echo may be lost on a loaded machine (the reply crosses the hypervisor's relay): retry.
	eventually(t, "an answer to ping "+ip, func() bool { return lab.ping(ip) == nil })
	if got := lab.neighbourMAC(ip); got != nc.Mac {
		t.Fatalf("neighbour table has %s at %q, want the VM's MAC %s", ip, got, nc.Mac)
	}
	if mac, addrs := lab.guestLink(vm, "eth0"); mac != nc.Mac || !slices.Equal(addrs, []string{ip + "/24"}) {
		t.Fatalf("guest eth0: mac %s addrs %v", mac, addrs)
	}
	guestPID, _ := cocoonsim.GuestOSPID(vm.PID)

	lab.ok("vm", "rm", "--force", "web")
	lab.checkNoNetworkLeft()
	eventually(t, "guest OS process to end", func() bool { return !testproc.Running(guestPID) })
}

func TestCNIGuestsReachEachOther(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	a := lab.runVM("img", "a", "--cpu", "1")
	b := lab.runVM("img", "b", "--cpu", "1", "--nics", "2")
	ipA, ipB := a.NetworkConfigs[0].Network.IP, b.NetworkConfigs[0].Network.IP
	if a.NetworkConfigs[0].NumQueues != 2 {
		t.Fatalf("one vCPU, one queue pair: %+v", a.NetworkConfigs[0])
	}
	lab.probeFromGuest(a, ipB, "b "+ipB)
	lab.probeFromGuest(b, ipA, "a "+ipA)

	// A second NIC is eth1 in the guest, with its own MAC and address.
	nic1 := b.NetworkConfigs[1]
	if nic1.Tap != "tap"+b.ID[:8]+"-1" || nic1.NetnsPath != b.NetworkConfigs[0].NetnsPath || nic1.Network == nil || nic1.Network.IP == ipB {
		t.Fatalf("second NIC: %+v", nic1)
	}
	if mac, addrs := lab.guestLink(b, "eth1"); mac != nic1.Mac || !slices.Equal(addrs, []string{nic1.Network.IP + "/24"}) {
		t.Fatalf("guest eth1: mac %s addrs %v", mac, addrs)
	}
	lab.probeFromGuest(a, nic1.Network.IP, "b "+nic1.Network.IP)
	lab.checkNetworkIndex(b.ID, map[string]string{"eth0": ipB, "eth1": nic1.Network.IP})

	lab.ok("vm", "rm", "--force", "a", "b")
	lab.checkNoNetworkLeft()
}

func TestCNICloudImageGuestReadsItsSeed(t *testing.T) {
	requireTool(t, "qemu-img")
	lab := newNetLab(t, labOptions{})
	lab.importCloudImage("cloud", guest.Spec{})
	vm := lab.runVM("cloud", "ubuntu", "--cpu", "1")
	ip := vm.NetworkConfigs[0].Network.IP
	lab.mustProbe(lab.ns, ip, "ubuntu "+ip)
	// After the first boot cocoon no longer attaches the seed; the guest keeps what it applied.
	lab.ok("vm", "stop", "ubuntu")
	lab.ok("vm", "start", "ubuntu")
	lab.mustProbe(lab.ns, ip, "ubuntu "+ip)
	lab.ok("vm", "rm", "--force", "ubuntu")
	lab.checkNoNetworkLeft()
}

func TestCNIStopStartKeepsAddressAndRecoversALostNetns(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	vm := lab.runVM("img", "db", "--cpu", "1")
	nc := vm.NetworkConfigs[0]
	ip := nc.Network.IP

	lab.ok("vm", "stop", "db")
	if _, err := os.Stat(nc.NetnsPath); err != nil {
		t.Fatalf("vm stop must keep the netns: %v", err)
	}
	lab.ok("vm", "start", "db")
	restarted := lab.inspect("db")
	if !slices.EqualFunc(restarted.NetworkConfigs, vm.NetworkConfigs, sameNIC) {
		t.Fatalf("restart changed the NICs: %+v", restarted.NetworkConfigs[0])
	}
	lab.mustProbe(lab.ns, ip, "db "+ip)
	if got := lab.neighbourMAC(ip); got != nc.Mac {
		t.Fatalf("after restart the neighbour table has %q, want %s", got, nc.Mac)
	}

	// Behind cocoon's back, as a host reboot would: the netns and everything in it go.
	lab.ok("vm", "stop", "db")
	if err := unix.Unmount(nc.NetnsPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(nc.NetnsPath); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lost netns's veth to leave the bridge", func() bool { return len(lab.bridgePorts(labBridge)) == 0 })

	r := lab.cocoon("vm", "start", "db")
	if r.code != 0 || !strings.Contains(stripANSI(r.stderr), "network missing for VM "+vm.ID+", recovering") {
		t.Fatalf("start with a lost netns: exit %d\n%s", r.code, stripANSI(r.stderr))
	}
	recovered := lab.inspect("db")
	if !slices.EqualFunc(recovered.NetworkConfigs, vm.NetworkConfigs, sameNIC) {
		t.Fatalf("recovery changed the NICs: %+v", recovered.NetworkConfigs[0])
	}
	if !sameNetns(t, recovered.PID, nc.NetnsPath) {
		t.Fatal("the restarted hypervisor does not run in the recreated netns")
	}
	lab.mustProbe(lab.ns, ip, "db "+ip)
	if got := lab.neighbourMAC(ip); got != nc.Mac {
		t.Fatalf("after recovery the neighbour table has %q, want %s", got, nc.Mac)
	}
	if got := lab.leases(); !slices.Equal(got, []string{ip}) {
		t.Fatalf("host-local leases after recovery: %v", got)
	}
	lab.ok("vm", "rm", "--force", "db")
	lab.checkNoNetworkLeft()
}

func TestCNIAddFailureRollsBack(t *testing.T) {
	lab := newNetLab(t, labOptions{rangeEnd: "10.99.0.2"})
	lab.seedImage("img", guest.Spec{})
	// One address for two NICs: eth0 gets it, eth1's ADD fails, and eth0 is deleted again.
	r := lab.cocoon("vm", "run", "--name", "greedy", "--nics", "2", "img")
	want := regexp.MustCompile(`^Error: configure network: cni add [A-Z2-7]{26}/eth1: plugin type="bridge" failed \(add\): .*no IP addresses available`)
	if r.code != 1 || !want.MatchString(r.errorLine()) {
		t.Fatalf("run with too few addresses: exit %d, %q", r.code, r.errorLine())
	}
	lab.checkNoNetworkLeft()
	if got := lab.listVMs(); len(got) != 0 {
		t.Fatalf("a failed network setup left a VM: %+v", got)
	}
}

func TestCNICreateFailureReleasesTheNetwork(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	first := decode[cocoon.VM](t, lab.ok("vm", "create", "--name", "dup", "-o", "json", "img"))
	// The name clash shows only after the network exists; cocoon rolls it back.
	r := lab.cocoon("vm", "create", "--name", "dup", "img")
	if r.code != 1 || !strings.HasPrefix(r.errorLine(), `Error: create VM: reserve VM record: vm name "dup" already exists (id: `) {
		t.Fatalf("duplicate create: exit %d, %q", r.code, r.errorLine())
	}
	if got := lab.pins(); !slices.Equal(got, []string{"cocoon-" + first.ID}) {
		t.Fatalf("netns pins after the rollback: %v", got)
	}
	if got := lab.leases(); !slices.Equal(got, []string{first.NetworkConfigs[0].Network.IP}) {
		t.Fatalf("leases after the rollback: %v", got)
	}
	lab.checkNetworkIndex(first.ID, map[string]string{"eth0": first.NetworkConfigs[0].Network.IP})
	lab.ok("vm", "rm", "dup")
	lab.checkNoNetworkLeft()
}

func TestNetworkErrorsMatchCocoon(t *testing.T) {
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--network", "nosuch"}, `configure network: conflist "nosuch" not found (available: simnet)`},
		{[]string{"--bridge", "nosuch0"}, "init network: init bridge network: bridge nosuch0: Link not found"},
		{[]string{"--bridge", "lo"}, "init network: init bridge network: lo is not a bridge (type: device)"},
		{[]string{"--bridge", "lo", "--network", labNetwork}, "--bridge and --network are mutually exclusive"},
	} {
		lab.fails(tc.want, append(append([]string{"vm", "run"}, tc.args...), "img")...)
	}
	if err := os.Remove(filepath.Join(lab.ci, "10-simnet.conflist")); err != nil {
		t.Fatal(err)
	}
	lab.fails("configure network: network provider not configured: no conflist found in "+lab.ci, "vm", "run", "img")
	lab.checkNoNetworkLeft()
	if got := lab.listVMs(); len(got) != 0 {
		t.Fatalf("failed runs left VMs: %+v", got)
	}
}

func TestBridgeModeTAPOnAnExistingBridge(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	if err := lab.netlink(func(h *netlink.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-sim"}}
		if err := h.LinkAdd(br); err != nil {
			return err
		}
		return h.LinkSetUp(br)
	}); err != nil {
		t.Fatal(err)
	}
	vm := lab.runVM("img", "dhcp", "--cpu", "1", "--bridge", "br-sim")
	nc := vm.NetworkConfigs[0]
	mac, err := net.ParseMAC(nc.Mac)
	if err != nil || mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
		t.Fatalf("bridge mode MAC %q must be random, locally administered, unicast", nc.Mac)
	}
	if nc.Tap != "bt"+vm.ID[:8]+"-0" || nc.Backend != "bridge" || nc.BridgeDev != "br-sim" || nc.NetnsPath != "" || nc.Network != nil || vm.Config.Network != "" {
		t.Fatalf("bridge mode network_configs[0]: %+v (config.network %q)", nc, vm.Config.Network)
	}
	if got := lab.bridgePorts("br-sim"); !slices.Equal(got, []string{nc.Tap}) {
		t.Fatalf("br-sim ports: %v", got)
	}
	if guestMAC, addrs := lab.guestLink(vm, "eth0"); guestMAC != nc.Mac || len(addrs) != 0 {
		t.Fatalf("guest eth0 (DHCP, so no address): mac %s addrs %v", guestMAC, addrs)
	}
	if len(lab.pins()) != 0 {
		t.Fatalf("bridge mode made a netns: %v", lab.pins())
	}

	// A lost TAP is recreated, with the same MAC, by the next start.
	lab.ok("vm", "stop", "dhcp")
	if err := lab.netlink(func(h *netlink.Handle) error {
		tap, err := h.LinkByName(nc.Tap)
		if err != nil {
			return err
		}
		return h.LinkDel(tap)
	}); err != nil {
		t.Fatal(err)
	}
	lab.ok("vm", "start", "dhcp")
	if got := lab.bridgePorts("br-sim"); !slices.Equal(got, []string{nc.Tap}) {
		t.Fatalf("br-sim ports after recovery: %v", got)
	}
	if guestMAC, _ := lab.guestLink(lab.inspect("dhcp"), "eth0"); guestMAC != nc.Mac {
		t.Fatalf("guest MAC after recovery %s, want %s", guestMAC, nc.Mac)
	}
	lab.ok("vm", "rm", "--force", "dhcp")
	if got := lab.bridgePorts("br-sim"); len(got) != 0 {
		t.Fatalf("vm rm left TAPs on br-sim: %v", got)
	}
}

func TestCloneGetsItsOwnNetwork(t *testing.T) {
	lab := newNetLab(t, labOptions{})
	lab.importSnapshot(testimage.SnapshotOptions{Name: "base", NICs: 1, CPU: 2})
	vm := lab.clone("base", "c1")
	nc := vm.NetworkConfigs[0]
	if nc.Tap != "tap"+vm.ID[:8]+"-0" || nc.NetnsPath != filepath.Join(lab.netnsDir, "cocoon-"+vm.ID) || nc.NumQueues != 4 || nc.Network == nil || nc.Network.IP == "" {
		t.Fatalf("clone network_configs[0]: %+v", nc)
	}
	if !sameNetns(t, vm.PID, nc.NetnsPath) {
		t.Fatal("the clone's hypervisor does not run in its netns")
	}
	// The snapshot's NIC was swapped for the clone's: only the clone's TAP is in its netns.
	if got := lab.linksIn(nc.NetnsPath); !slices.Equal(got, []string{"eth0", "lo", nc.Tap}) {
		t.Fatalf("links in the clone's netns: %v", got)
	}
	// The snapshotted guest had no address configured, and a restored guest keeps its own
	// network state: the new NIC (with the clone's MAC) is up, without an address.
	if mac, addrs := lab.guestLink(vm, "eth0"); mac != nc.Mac || len(addrs) != 0 {
		t.Fatalf("cloned guest eth0: mac %s addrs %v", mac, addrs)
	}
	// A cold boot reads the clone's own kernel command line.
	lab.ok("vm", "stop", "c1")
	lab.ok("vm", "start", "c1")
	lab.mustProbe(lab.ns, nc.Network.IP, "c1 "+nc.Network.IP)
	lab.ok("vm", "rm", "--force", "c1")
	lab.checkNoNetworkLeft()
}

func TestCloneKeepsTheSnapshottedGuestAddressUntilRestart(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	src := lab.runVM("img", "src", "--cpu", "1")
	srcIP := src.NetworkConfigs[0].Network.IP
	lab.ok("snapshot", "save", "--name", "snap", "src")
	lab.ok("vm", "rm", "--force", "src")

	clone := lab.clone("snap", "copy")
	nc := clone.NetworkConfigs[0]
	if nc.Network.IP == srcIP || nc.Mac == src.NetworkConfigs[0].Mac {
		t.Fatalf("the clone must get its own IP and MAC: %+v vs source %+v", nc, src.NetworkConfigs[0])
	}
	// cocoon's post-clone IP window: the guest resumes with the source's address and hostname,
	// on the clone's new NIC.
	lab.mustProbe(lab.ns, srcIP, "src "+srcIP)
	if got := lab.neighbourMAC(srcIP); got != nc.Mac {
		t.Fatalf("the source address answers from %q, want the clone's MAC %s", got, nc.Mac)
	}
	lab.ok("vm", "stop", "copy")
	lab.ok("vm", "start", "copy")
	lab.mustProbe(lab.ns, nc.Network.IP, "copy "+nc.Network.IP)
	lab.ok("vm", "rm", "--force", "copy")
	lab.checkNoNetworkLeft()
}

// sameNIC compares what a restart or recovery must keep.
func sameNIC(a, b *cocoon.NetworkConfig) bool {
	return a.Tap == b.Tap && a.Mac == b.Mac && a.NetnsPath == b.NetnsPath && *a.Network == *b.Network
}

// checkNetworkIndex checks cocoon's CNI records of a VM: one per NIC, by interface.
func (lab *netLab) checkNetworkIndex(vmID string, wantIPs map[string]string) {
	lab.t.Helper()
	data, err := os.ReadFile(filepath.Join(lab.root, "cni", "db", "networks.json"))
	if err != nil {
		lab.t.Fatal(err)
	}
	var idx struct {
		Networks map[string]struct {
			Network cocoon.Network `json:"network"`
			ID      string         `json:"id"`
			Type    string         `json:"type"`
			VMID    string         `json:"vm_id"`
			IfName  string         `json:"if_name"`
		} `json:"networks"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		lab.t.Fatal(err)
	}
	got := map[string]string{}
	for id, rec := range idx.Networks {
		if rec.VMID != vmID {
			continue
		}
		if rec.ID != id || rec.Type != labNetwork {
			lab.t.Fatalf("network record %s: %+v", id, rec)
		}
		got[rec.IfName] = rec.Network.IP
	}
	if fmt.Sprint(got) != fmt.Sprint(wantIPs) {
		lab.t.Fatalf("network records of %s: %v, want %v", vmID, got, wantIPs)
	}
}

// checkTCRedirect checks cocoon's wiring inside the VM's netns: the CNI interface without
// addresses, the TAP with its MTU, and a mirred redirect each way.
func (lab *netLab) checkTCRedirect(nc *cocoon.NetworkConfig) {
	lab.t.Helper()
	if err := inPinnedNetns(nc.NetnsPath, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		tap, err := h.LinkByName(nc.Tap)
		if err != nil {
			return err
		}
		if tap.Type() != "tuntap" || tap.Attrs().MTU != eth.Attrs().MTU || eth.Attrs().HardwareAddr.String() != nc.Mac {
			return fmt.Errorf("tap %+v / eth0 %+v", tap.Attrs(), eth.Attrs())
		}
		if addrs, _ := h.AddrList(eth, netlink.FAMILY_V4); len(addrs) != 0 {
			return fmt.Errorf("eth0 kept its addresses: %v", addrs)
		}
		for from, to := range map[netlink.Link]netlink.Link{eth: tap, tap: eth} {
			filters, err := h.FilterList(from, netlink.HANDLE_INGRESS)
			if err != nil {
				return err
			}
			if !redirectsTo(filters, to.Attrs().Index) {
				return fmt.Errorf("no ingress redirect %s -> %s: %+v", from.Attrs().Name, to.Attrs().Name, filters)
			}
		}
		return nil
	}); err != nil {
		lab.t.Fatalf("tc wiring in %s: %v", nc.NetnsPath, err)
	}
}

func redirectsTo(filters []netlink.Filter, ifindex int) bool {
	for _, f := range filters {
		u32, ok := f.(*netlink.U32)
		if !ok {
			continue
		}
		for _, a := range u32.Actions {
			if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR && m.Ifindex == ifindex {
				return true
			}
		}
	}
	return false
}

// linksIn lists the interfaces of a pinned netns, sorted.
func (lab *netLab) linksIn(path string) []string {
	lab.t.Helper()
	var names []string
	if err := inPinnedNetns(path, func(h *netlink.Handle) error {
		links, err := h.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	}); err != nil {
		lab.t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// checkNoNetworkLeft checks that nothing of any VM's network remains: no pinned netns, no veth
// on the CNI bridge, no host-local lease, no CNI record.
func (lab *netLab) checkNoNetworkLeft() {
	lab.t.Helper()
	if got := lab.pins(); len(got) != 0 {
		lab.t.Fatalf("netns pins left: %v", got)
	}
	if got := lab.leases(); len(got) != 0 {
		lab.t.Fatalf("host-local leases left: %v", got)
	}
	eventually(lab.t, "no veth on the CNI bridge", func() bool { return len(lab.bridgePorts(labBridge)) == 0 })
	if data, err := os.ReadFile(filepath.Join(lab.root, "cni", "db", "networks.json")); err == nil && strings.Contains(string(data), `"vm_id"`) {
		lab.t.Fatalf("CNI records left: %s", data)
	}
}

// TestCNIHibernateRestoreKeepsTheGuestOnItsAddress: a VM restored from its hibernation answers
// at the same IP from the same MAC, in its own netns, also when the netns was lost while it slept
// (a host reboot): restore heals a stopped VM's network as vm start does.
func TestCNIHibernateRestoreKeepsTheGuestOnItsAddress(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{HTTPPort: 80})
	vm := lab.runVM("img", "db", "--cpu", "1")
	nc := vm.NetworkConfigs[0]
	ip := nc.Network.IP
	lab.mustProbe(lab.ns, ip, "db "+ip)
	lab.mustGetPage("http://"+ip+"/", "db", ip)

	lab.ok("vm", "hibernate", "--name", "nap", "db")
	lab.ok("vm", "restore", "db", "nap")
	restored := lab.inspect("db")
	if !slices.EqualFunc(restored.NetworkConfigs, vm.NetworkConfigs, sameNIC) || restored.PID == vm.PID {
		t.Fatalf("restore changed the NICs or kept the hypervisor: %+v, pid %d", restored.NetworkConfigs[0], restored.PID)
	}
	if !sameNetns(t, restored.PID, nc.NetnsPath) {
		t.Fatal("the restored hypervisor does not run in the VM's netns")
	}
	lab.mustProbe(lab.ns, ip, "db "+ip)
	lab.mustGetPage("http://"+ip+"/", "db", ip)
	if got := lab.neighbourMAC(ip); got != nc.Mac {
		t.Fatalf("after restore the neighbour table has %q, want %s", got, nc.Mac)
	}

	// Hibernated, then the netns goes behind cocoon's back.
	lab.ok("vm", "hibernate", "--name", "nap2", "db")
	if err := unix.Unmount(nc.NetnsPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(nc.NetnsPath); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lost netns's veth to leave the bridge", func() bool { return len(lab.bridgePorts(labBridge)) == 0 })
	r := lab.cocoon("vm", "restore", "db", "nap2")
	if r.code != 0 || !strings.Contains(stripANSI(r.stderr), "network missing for VM "+vm.ID+", recovering") {
		t.Fatalf("restore with a lost netns: exit %d\n%s", r.code, stripANSI(r.stderr))
	}
	recovered := lab.inspect("db")
	if !slices.EqualFunc(recovered.NetworkConfigs, vm.NetworkConfigs, sameNIC) || !sameNetns(t, recovered.PID, nc.NetnsPath) {
		t.Fatalf("recovery changed the NICs or the netns: %+v", recovered.NetworkConfigs[0])
	}
	lab.mustProbe(lab.ns, ip, "db "+ip)
	lab.mustGetPage("http://"+ip+"/", "db", ip)
	if got := lab.neighbourMAC(ip); got != nc.Mac {
		t.Fatalf("after recovery the neighbour table has %q, want %s", got, nc.Mac)
	}
	lab.ok("vm", "rm", "--force", "db")
	lab.checkNoNetworkLeft()
}

// mustGetPage GETs the guest's web page at url and checks it names the guest's hostname and the
// address it was reached at.
func (lab *netLab) mustGetPage(url, hostname, ip string) {
	lab.t.Helper()
	code, body := lab.httpGet(lab.t, url)
	if code != http.StatusOK || !strings.Contains(body, "<h1>cocoon-sim guest "+hostname+"</h1>") || !strings.Contains(body, "reached at "+ip+"<") {
		lab.t.Fatalf("GET %s: %d %q, want the page of %s reached at %s", url, code, body, hostname, ip)
	}
}

// A hibernated VM comes back as its guest was, not as it booted: cocoon-cri gives a clone its pod
// address, route and hostname through vm exec, and the woken guest answers there, from its web
// server, under that hostname, as cloud-hypervisor restores the guest's kernel and processes.
func TestHibernateRestoreKeepsTheNetworkTheGuestWasGiven(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "ip")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{HTTPPort: 80})
	src := lab.runVM("img", "src", "--cpu", "1")
	srcIP := src.NetworkConfigs[0].Network.IP
	lab.ok("snapshot", "save", "--name", "snap", "src")
	lab.ok("vm", "rm", "--force", "src")

	clone := lab.clone("snap", "copy")
	nc := clone.NetworkConfigs[0].Network
	lab.inGuest("copy", "sh", "-c", fmt.Sprintf(`set -e
for d in /sys/class/net/*; do [ "$(cat $d/address)" = %s ] && dev=${d##*/}; done
ip link set "$dev" up
ip addr flush dev "$dev"
ip addr add %s/%d dev "$dev"
ip addr add 192.0.2.7/32 dev "$dev"
ip route replace default via %s dev "$dev"
hostname copy`, clone.NetworkConfigs[0].Mac, nc.IP, nc.Prefix, nc.Gateway))
	lab.mustGetPage("http://"+nc.IP+"/", "copy", nc.IP)
	before := lab.inGuest("copy", "sh", "-c", "ip -4 -o addr show dev eth0 | awk '{print $4}'; ip -4 route show default; ip -o link show dev eth0 | grep -o 'link/ether [^ ]*'")

	lab.ok("vm", "hibernate", "--name", "nap", "copy")
	lab.ok("vm", "restore", "copy", "nap")
	lab.mustGetPage("http://"+nc.IP+"/", "copy", nc.IP)
	lab.mustProbe(lab.ns, nc.IP, "copy "+nc.IP)
	if got := lab.inGuest("copy", "sh", "-c", "ip -4 -o addr show dev eth0 | awk '{print $4}'; ip -4 route show default; ip -o link show dev eth0 | grep -o 'link/ether [^ ]*'"); got != before {
		t.Fatalf("the restored guest's network:\n%s\nbefore the hibernation:\n%s", got, before)
	}
	if got, err := lab.probe(srcIP); err == nil {
		t.Fatalf("the snapshot's address answers again after the restore: %q", got)
	}
	lab.ok("vm", "rm", "--force", "copy")
	lab.checkNoNetworkLeft()
}

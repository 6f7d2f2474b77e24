package cocoonsim_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nsthread"
)

// The network tests run every simulator command inside a network namespace the test made, with
// Debian's reference CNI plugins: the bridge, its veths and the VMs' own namespaces never touch
// the host's network, and every VM namespace is pinned in the test's temp dir.
const (
	cniBinDir   = "/usr/lib/cni"
	labNetwork  = "simnet"
	labBridge   = "cni-sim0"
	labSubnet   = "10.99.0.0/24"
	labGateway  = "10.99.0.1"
	dialTimeout = 2 * time.Second
)

// netLab is a sim whose commands run in a private network namespace with a CNI conflist.
type netLab struct {
	*sim
	ns       netns.NsHandle
	netnsDir string
	ipamDir  string
}

type labOptions struct {
	// rangeEnd limits host-local to the addresses from .2 up to it; "" means the whole subnet.
	rangeEnd string
}

// newNetLab needs root and the CNI plugins; it skips otherwise.
func newNetLab(t *testing.T, opts labOptions) *netLab {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("network tests need root: they create network namespaces, veths, TAPs and tc filters")
	}
	for _, plugin := range []string{"bridge", "host-local", "portmap"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, plugin)); err != nil {
			t.Skipf("CNI plugin %s not installed (Debian package containernetworking-plugins; hack/setup.sh installs it)", plugin)
		}
	}
	s := newSim(t)
	base := filepath.Dir(s.root)
	ns, err := nsthread.New()
	if err != nil {
		t.Fatal(err)
	}
	lab := &netLab{sim: s, ns: ns, netnsDir: filepath.Join(base, "netns"), ipamDir: filepath.Join(base, "ipam")}
	// Registered after newSim's cleanup, so it runs first: guests die, then the namespaces.
	t.Cleanup(lab.cleanup)
	s.env = []string{cocoonsim.NetnsDirEnv + "=" + lab.netnsDir, "COCOON_CNI_BIN_DIR=" + cniBinDir}
	s.inNetns = func(fn func() error) error { return nsthread.In(ns, fn) }
	if err := lab.netlink(func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	lab.writeConflist(opts)
	return lab
}

func (lab *netLab) writeConflist(opts labOptions) {
	lab.t.Helper()
	rng := fmt.Sprintf(`{"subnet":%q}`, labSubnet)
	if opts.rangeEnd != "" {
		rng = fmt.Sprintf(`{"subnet":%q,"rangeStart":"10.99.0.2","rangeEnd":%q}`, labSubnet, opts.rangeEnd)
	}
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[
  {"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[%s]],"dataDir":%q}},
  {"type":"portmap","capabilities":{"portMappings":true}}]}`, labNetwork, labBridge, rng, lab.ipamDir)
	if err := os.MkdirAll(lab.ci, 0o750); err != nil {
		lab.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lab.ci, "10-simnet.conflist"), []byte(conflist), 0o600); err != nil {
		lab.t.Fatal(err)
	}
}

// cleanup kills the guests, unpins every VM namespace the test left and lets the lab's namespace
// go; deleting the namespaces deletes every interface in them.
func (lab *netLab) cleanup() {
	if err := cocoonsim.KillGuests(lab.run); err != nil {
		lab.t.Errorf("kill guests: %v", err)
	}
	pins, _ := filepath.Glob(filepath.Join(lab.netnsDir, "*"))
	for _, pin := range pins {
		if err := unix.Unmount(pin, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			lab.t.Errorf("unmount %s: %v", pin, err)
		}
		_ = os.Remove(pin)
	}
	_ = lab.ns.Close()
}

// netlink runs fn with a netlink handle inside the lab's namespace.
func (lab *netLab) netlink(fn func(*netlink.Handle) error) error {
	return inNetnsHandle(lab.ns, fn)
}

func inNetnsHandle(ns netns.NsHandle, fn func(*netlink.Handle) error) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// runVM runs an image VM with the lab's network and returns its inspect record.
func (lab *netLab) runVM(image, name string, extra ...string) cocoon.VM {
	lab.t.Helper()
	lab.ok(append([]string{"vm", "run", "--name", name, "--storage", "10G", "-o", "json"}, append(extra, image)...)...)
	return lab.inspect(name)
}

// probe connects to the guest probe port at ip from the lab's namespace and returns its answer.
func (lab *netLab) probe(ip string) (string, error) {
	return probeFrom(lab.ns, ip)
}

// probeFrom connects to ip's probe port from inside ns.
func probeFrom(ns netns.NsHandle, ip string) (string, error) {
	var conn net.Conn
	if err := nsthread.In(ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(ip, fmt.Sprint(guest.ProbePort)), dialTimeout)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close() //nolint:errcheck
	_ = conn.SetDeadline(time.Now().Add(dialTimeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// mustProbe polls the probe until it answers and checks the answer.
func (lab *netLab) mustProbe(ns netns.NsHandle, ip, want string) {
	lab.t.Helper()
	var got string
	var err error
	eventually(lab.t, "probe of "+ip, func() bool {
		got, err = probeFrom(ns, ip)
		return err == nil
	})
	if got != want {
		lab.t.Fatalf("probe %s answered %q, want %q", ip, got, want)
	}
}

// ping sends one ICMP echo from the lab's namespace and waits for the reply.
func (lab *netLab) ping(ip string) error {
	var conn *icmp.PacketConn
	if err := nsthread.In(lab.ns, func() error {
		var err error
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}); err != nil {
		return err
	}
	defer conn.Close() //nolint:errcheck
	id := os.Getpid() & 0xffff
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("cocoon-sim")}}
	wire, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	dst := &net.IPAddr{IP: net.ParseIP(ip)}
	if _, err := conn.WriteTo(wire, dst); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(dialTimeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return err
		}
		reply, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || reply.Type != ipv4.ICMPTypeEchoReply || from.String() != ip {
			continue
		}
		if echo, ok := reply.Body.(*icmp.Echo); ok && echo.ID == id {
			return nil
		}
	}
}

// neighbourMAC is the MAC the lab's namespace learned for ip.
func (lab *netLab) neighbourMAC(ip string) string {
	lab.t.Helper()
	var mac string
	if err := lab.netlink(func(h *netlink.Handle) error {
		neighs, err := h.NeighList(0, netlink.FAMILY_V4)
		for _, n := range neighs {
			if n.IP.String() == ip && n.HardwareAddr != nil {
				mac = n.HardwareAddr.String()
			}
		}
		return err
	}); err != nil {
		lab.t.Fatal(err)
	}
	return mac
}

// bridgePorts are the interfaces enslaved to a bridge in the lab's namespace; none if there is
// no such bridge.
func (lab *netLab) bridgePorts(bridge string) []string {
	lab.t.Helper()
	var ports []string
	if err := lab.netlink(func(h *netlink.Handle) error {
		br, err := h.LinkByName(bridge)
		if err != nil {
			return nil //nolint:nilerr // no bridge, no ports
		}
		links, err := h.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				ports = append(ports, l.Attrs().Name)
			}
		}
		return err
	}); err != nil {
		lab.t.Fatal(err)
	}
	return ports
}

// leases are host-local's allocation files: one per leased IP.
func (lab *netLab) leases() []string {
	lab.t.Helper()
	entries, _ := os.ReadDir(filepath.Join(lab.ipamDir, labNetwork))
	var ips []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

// pins are the VM namespaces pinned in the lab's netns dir.
func (lab *netLab) pins() []string {
	entries, _ := os.ReadDir(lab.netnsDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// guestNetns opens the network namespace of a running VM's guest; the caller closes it.
func (lab *netLab) guestNetns(vm cocoon.VM) netns.NsHandle {
	lab.t.Helper()
	pid, err := cocoonsim.GuestOSPID(vm.PID)
	if err != nil || pid == 0 {
		lab.t.Fatalf("guest OS of %s (hypervisor %d): pid %d, %v", vm.Config.Name, vm.PID, pid, err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		lab.t.Fatal(err)
	}
	return ns
}

// probeFromGuest connects from inside one VM's guest to another address's probe port.
func (lab *netLab) probeFromGuest(vm cocoon.VM, ip, want string) {
	lab.t.Helper()
	ns := lab.guestNetns(vm)
	defer ns.Close() //nolint:errcheck
	lab.mustProbe(ns, ip, want)
}

// guestLink is the guest's view of one of its interfaces: MAC and IPv4 addresses.
func (lab *netLab) guestLink(vm cocoon.VM, ifName string) (mac string, addrs []string) {
	lab.t.Helper()
	ns := lab.guestNetns(vm)
	defer ns.Close() //nolint:errcheck
	if err := inNetnsHandle(ns, func(h *netlink.Handle) error {
		link, err := h.LinkByName(ifName)
		if err != nil {
			return err
		}
		mac = link.Attrs().HardwareAddr.String()
		list, err := h.AddrList(link, netlink.FAMILY_V4)
		for _, a := range list {
			addrs = append(addrs, a.IPNet.String())
		}
		return err
	}); err != nil {
		lab.t.Fatalf("guest %s of %s: %v", ifName, vm.Config.Name, err)
	}
	return mac, addrs
}

// inPinnedNetns runs fn with a netlink handle in the namespace pinned at path; the namespace is
// not held afterwards.
func inPinnedNetns(path string, fn func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close() //nolint:errcheck
	return inNetnsHandle(ns, fn)
}

// sameNetns reports whether a process lives in the namespace pinned at path.
func sameNetns(t *testing.T, pid int, path string) bool {
	t.Helper()
	var proc, pin unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &proc); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(path, &pin); err != nil {
		t.Fatal(err)
	}
	return proc.Ino == pin.Ino && proc.Dev == pin.Dev
}

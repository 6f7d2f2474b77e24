package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"maps"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nsthread"
)

// guestOSStartTimeout bounds how long the guest OS process may take to come up.
const guestOSStartTimeout = 20 * time.Second

// guestOS is what runs inside the VM while it runs, behind the hypervisor's devices.
type guestOS interface {
	// plug gives the running guest a NIC: at boot, or hot-plugged.
	plug(dev *nic) error
	// unplug takes the NIC with this device ID away again.
	unplug(id string)
	// plugDisk shows a hot-added disk to the running guest and returns its device name;
	// unplugDisk takes it away again.
	plugDisk(d Disk) (string, error)
	unplugDisk(dev, serial string) error
	// network is the guest's network state as it is now, which a snapshot keeps.
	network() (guestNetwork, error)
	// stop ends the guest; the hypervisor process goes on.
	stop()
}

// simulatedOS is the stand-in guest operating system: a process in network, UTS, mount and PID
// namespaces of its own, with one eth<i> per NIC relayed to the NIC's TAP and a virtio-vsock
// device its agent answers on. Its namespaces and interfaces exist only while that process and
// the hypervisor live.
type simulatedOS struct {
	logger   *log.Logger
	netState guestNetwork
	proc     *exec.Cmd
	exited   chan struct{}
	stopping atomic.Bool // the hypervisor is ending the guest, which is then no shutdown of its own
	lifeline *os.File    // write end; closing it ends the guest
	vsock    *net.UnixConn
	guestNS  netns.NsHandle
	relayNS  netns.NsHandle

	mu    sync.Mutex
	links map[string]*nicLink // by device ID
}

// startSimulatedOS starts the guest OS process as plan says, with the network state netState,
// and waits until it listens. It has no NIC yet. shm, with plan.RestoreShm, is the snapshot's
// memory file at the tmpfs the guest restores. onShutdown runs if the guest powers itself off.
func startSimulatedOS(logger *log.Logger, vmName string, plan osPlan, netState guestNetwork, shm *os.File, onShutdown func()) (_ *simulatedOS, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	planEnv, err := plan.env()
	if err != nil {
		return nil, err
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("lifeline pipe: %w", err)
	}
	defer lifeR.Close() //nolint:errcheck
	readyR, readyW, err := os.Pipe()
	if err != nil {
		_ = lifeW.Close()
		return nil, fmt.Errorf("ready pipe: %w", err)
	}
	defer readyR.Close() //nolint:errcheck
	vsockHost, vsockGuestEnd, err := newVsockDevice()
	if err != nil {
		_ = lifeW.Close()
		_ = readyW.Close()
		return nil, err
	}
	defer vsockGuestEnd.Close() //nolint:errcheck
	extra := []*os.File{lifeR, readyW, vsockGuestEnd}
	if plan.RestoreShm {
		extra = append(extra, shm)
	}
	proc := &exec.Cmd{
		Path:       self,
		Args:       []string{guestOSArgv0, vmName},
		Env:        append(os.Environ(), roleEnv+"="+roleGuestOS, planEnv),
		ExtraFiles: extra,
		Stdout:     os.Stderr,
		Stderr:     os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		},
	}
	startErr := startWithoutSettingTime(proc)
	_ = readyW.Close()
	if startErr != nil {
		_ = lifeW.Close()
		_ = vsockHost.Close()
		return nil, fmt.Errorf("start guest OS: %w", startErr)
	}
	s := &simulatedOS{
		logger: logger, netState: netState, proc: proc, exited: make(chan struct{}), lifeline: lifeW,
		vsock: vsockHost, guestNS: netns.None(), relayNS: netns.None(), links: map[string]*nicLink{},
	}
	go func() {
		_ = proc.Wait()
		close(s.exited)
		if !s.stopping.Load() && poweredOff(proc.ProcessState) {
			onShutdown()
		}
	}()
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if err := awaitReady(readyR); err != nil {
		return nil, fmt.Errorf("guest OS: %w", err)
	}
	if s.guestNS, err = netns.GetFromPid(proc.Process.Pid); err != nil {
		return nil, fmt.Errorf("guest netns: %w", err)
	}
	if s.relayNS, err = nsthread.New(); err != nil {
		return nil, fmt.Errorf("relay netns: %w", err)
	}
	if err := nsthread.In(s.relayNS, disableIPv6); err != nil {
		return nil, fmt.Errorf("relay netns: %w", err)
	}
	if err := s.inGuest(func(h *netlink.Handle) error { return setLinkUp(h, "lo") }); err != nil {
		return nil, err
	}
	logger.Printf("guest OS up (pid %d, hostname %s)", proc.Process.Pid, plan.Hostname)
	return s, nil
}

func awaitReady(r *os.File) error {
	_ = r.SetReadDeadline(time.Now().Add(guestOSStartTimeout))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no word from the guest OS process: %w", err)
	}
	if msg, failed := strings.CutPrefix(strings.TrimSpace(line), "error: "); failed {
		return errors.New(msg)
	}
	return nil
}

// inGuest runs fn with a netlink handle inside the guest's network namespace.
func (s *simulatedOS) inGuest(fn func(*netlink.Handle) error) error {
	h, err := netlink.NewHandleAt(s.guestNS)
	if err != nil {
		return fmt.Errorf("netlink in guest netns: %w", err)
	}
	defer h.Close()
	return fn(h)
}

// plug connects the NIC as the lowest free eth<i> (net.ifnames=0 naming) and configures it as the
// guest's network state says: address, up, default route; no entry leaves it up without address.
func (s *simulatedOS) plug(dev *nic) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ifName := s.freeIfName()
	l, err := linkNIC(dev, ifName, s.guestNS, s.relayNS)
	if err != nil {
		return err
	}
	if err := s.inGuest(func(h *netlink.Handle) error { return configureInterface(h, ifName, s.netState.Interfaces[ifName]) }); err != nil {
		l.close()
		return err
	}
	s.links[dev.net.ID] = l
	return nil
}

func (s *simulatedOS) freeIfName() string {
	used := map[string]bool{}
	for _, l := range s.links {
		used[l.ifName] = true
	}
	for i := 0; ; i++ {
		if name := fmt.Sprintf("eth%d", i); !used[name] {
			return name
		}
	}
}

func (s *simulatedOS) unplug(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.links[id]; l != nil {
		l.close()
		delete(s.links, id)
	}
}

// network reads the guest's network state from its kernel, as a snapshot of its memory would keep
// it: the hostname, and for each plugged interface its IPv4 addresses, default gateway, MAC (when
// the guest changed it) and whether it is up. Interfaces the guest has no NIC for keep the
// configuration the guest booted with, for a NIC plugged later.
func (s *simulatedOS) network() (guestNetwork, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hostname, err := s.hostname()
	if err != nil {
		return guestNetwork{}, err
	}
	gn := guestNetwork{Hostname: hostname, DNS: s.netState.DNS, Interfaces: maps.Clone(s.netState.Interfaces)}
	if gn.Interfaces == nil {
		gn.Interfaces = map[string]ipv4Config{}
	}
	err = s.inGuest(func(h *netlink.Handle) error {
		gateways, err := defaultGateways(h)
		if err != nil {
			return err
		}
		for _, l := range s.links {
			c, err := interfaceState(h, l.ifName, l.dev.net.Mac, gateways)
			if err != nil {
				return err
			}
			gn.Interfaces[l.ifName] = c
		}
		return nil
	})
	if err != nil {
		return guestNetwork{}, fmt.Errorf("read the guest's network state: %w", err)
	}
	return gn, nil
}

// hostname is the guest's hostname, read in its UTS namespace. The thread that enters it is
// thrown away afterwards.
func (s *simulatedOS) hostname() (string, error) {
	type result struct {
		name string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and the guest's namespace with it.
		runtime.LockOSThread()
		ch <- func() result {
			fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/uts", s.proc.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return result{err: fmt.Errorf("the guest's UTS namespace: %w", err)}
			}
			defer unix.Close(fd) //nolint:errcheck
			if err := unix.Setns(fd, unix.CLONE_NEWUTS); err != nil {
				return result{err: fmt.Errorf("enter the guest's UTS namespace: %w", err)}
			}
			var uts unix.Utsname
			if err := unix.Uname(&uts); err != nil {
				return result{err: err}
			}
			return result{name: unix.ByteSliceToString(uts.Nodename[:])}
		}()
	}()
	r := <-ch
	return r.name, r.err
}

// defaultGateways is the gateway of the default route of the guest's main table per interface
// index.
func defaultGateways(h *netlink.Handle) (map[int]string, error) {
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	gateways := map[int]string{}
	for _, r := range routes {
		if r.Gw == nil || (r.Dst != nil && !(r.Dst.IP.IsUnspecified() && isWholeSpace(r.Dst.Mask))) {
			continue
		}
		if _, seen := gateways[r.LinkIndex]; !seen {
			gateways[r.LinkIndex] = r.Gw.String()
		}
	}
	return gateways, nil
}

func isWholeSpace(mask net.IPMask) bool {
	ones, _ := mask.Size()
	return ones == 0
}

// interfaceState is the configuration the guest has on ifName now; nicMAC is the MAC of the NIC
// behind it.
func interfaceState(h *netlink.Handle, ifName, nicMAC string, gateways map[int]string) (ipv4Config, error) {
	link, err := h.LinkByName(ifName)
	if err != nil {
		return ipv4Config{}, fmt.Errorf("find %s: %w", ifName, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return ipv4Config{}, fmt.Errorf("addresses of %s: %w", ifName, err)
	}
	var c ipv4Config
	for _, a := range addrs {
		if c.Address == "" {
			c.Address = a.IPNet.String()
		} else {
			c.Extra = append(c.Extra, a.IPNet.String())
		}
	}
	if c.Address != "" {
		c.Gateway = gateways[link.Attrs().Index]
	}
	if mac := link.Attrs().HardwareAddr.String(); !strings.EqualFold(mac, nicMAC) {
		c.Mac = mac
	}
	c.Down = link.Attrs().Flags&net.FlagUp == 0
	return c, nil
}

// shmDir is the guest's /dev/shm, the tmpfs that is its RAM, as the hypervisor reaches it: through
// the root of the guest OS process, in the guest's mount namespace.
func (s *simulatedOS) shmDir() string {
	return fmt.Sprintf("/proc/%d/root%s", s.proc.Process.Pid, guestShm)
}

// connectVsock hands a host connection to the guest's vsock device.
func (s *simulatedOS) connectVsock(port uint32, conn *net.UnixConn) {
	deliverVsock(s.vsock, port, conn)
}

// stop unplugs every NIC and ends the guest OS process.
func (s *simulatedOS) stop() {
	s.mu.Lock()
	for id, l := range s.links {
		l.close()
		delete(s.links, id)
	}
	s.mu.Unlock()
	s.stopping.Store(true)
	_ = s.lifeline.Close()
	_ = s.proc.Process.Kill()
	<-s.exited
	_ = s.vsock.Close()
	if s.guestNS.IsOpen() {
		_ = s.guestNS.Close()
	}
	if s.relayNS.IsOpen() {
		_ = s.relayNS.Close()
	}
}

// poweredOff reports whether the guest's init ended as a guest that shuts itself down: with 0 (the
// simulated poweroff), or killed by SIGHUP, which is how the kernel ends a PID namespace whose
// process called reboot(2) to power off.
func poweredOff(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return st.ExitCode() == 0 || (ok && ws.Signaled() && ws.Signal() == syscall.SIGHUP)
}

// disableIPv6 keeps the interfaces created later in the current network namespace from
// autoconfiguring IPv6: the relay ends must send nothing of their own into the guest. A kernel
// without IPv6 has nothing to disable.
func disableIPv6() error {
	for _, conf := range []string{"all", "default"} {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0o644) //nolint:gosec // sysctl
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("disable IPv6: %w", err)
		}
	}
	return nil
}

func setLinkUp(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// configureInterface gives the guest interface its static address and default route, as the
// kernel's ip= autoconfiguration or cloud-init would, or, for a restored guest, what it had when
// the snapshot was taken (its further addresses, its own MAC, the link down); an empty config
// only brings it up.
func configureInterface(h *netlink.Handle, name string, c ipv4Config) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if c.Mac != "" {
		mac, err := net.ParseMAC(c.Mac)
		if err != nil {
			return fmt.Errorf("%s MAC %q: %w", name, c.Mac, err)
		}
		if err := h.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("set %s MAC %s: %w", name, c.Mac, err)
		}
	}
	for _, cidr := range slices.DeleteFunc(append([]string{c.Address}, c.Extra...), func(a string) bool { return a == "" }) {
		addr, err := netlink.ParseAddr(cidr)
		if err != nil {
			return fmt.Errorf("%s address %q: %w", name, cidr, err)
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", cidr, name, err)
		}
	}
	if c.Down {
		return nil
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	gw := net.ParseIP(c.Gateway)
	if c.Address == "" || gw == nil {
		return nil
	}
	// Only the first NIC with a gateway gets the default route, as only one ip= takes effect.
	err = h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw})
	if err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("default route via %s on %s: %w", gw, name, err)
	}
	return nil
}

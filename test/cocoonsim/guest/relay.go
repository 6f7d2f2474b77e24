package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nsthread"
)

// maxRelayFrame holds a virtio-net header plus the largest frame either side can hand over: a
// 64 KiB GSO segment the guest's stack sends through its veth.
const maxRelayFrame = 1 << 17

// defaultMTU is used when the TAP's own MTU cannot be read.
const defaultMTU = 1500

// nicLink is the guest side of one NIC: a veth pair whose guest end is the guest's eth<i>, with
// the NIC's MAC, and whose other end sits in the hypervisor's private relay namespace. An
// AF_PACKET socket on that end exchanges frames with the TAP queues. The socket speaks the same
// virtio-net header as the TAP (PACKET_VNET_HDR), so frames cross with their checksum and
// segmentation metadata intact, as they cross a real virtio-net device.
type nicLink struct {
	dev       *nic
	ifName    string // inside the guest
	relayName string // inside the relay namespace
	relay     *netlink.Handle
	sock      *os.File
	pumps     sync.WaitGroup
}

// linkNIC creates the veth pair (the guest end named ifName, in guestNS) and starts relaying.
func linkNIC(dev *nic, ifName string, guestNS, relayNS netns.NsHandle) (*nicLink, error) {
	mac, err := net.ParseMAC(dev.net.Mac)
	if err != nil {
		return nil, fmt.Errorf("NIC %s: MAC %q: %w", dev.net.Tap, dev.net.Mac, err)
	}
	relay, err := netlink.NewHandleAt(relayNS)
	if err != nil {
		return nil, fmt.Errorf("netlink in relay netns: %w", err)
	}
	l := &nicLink{dev: dev, ifName: ifName, relayName: "to-" + ifName, relay: relay}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: l.relayName, MTU: tapMTU(dev.net.Tap)},
		PeerName:         ifName,
		PeerHardwareAddr: mac,
		PeerNamespace:    netlink.NsFd(guestNS),
	}
	if err := relay.LinkAdd(veth); err != nil {
		relay.Close()
		return nil, fmt.Errorf("create %s for TAP %s: %w", ifName, dev.net.Tap, err)
	}
	if err := l.openSocket(relayNS); err != nil {
		l.close()
		return nil, err
	}
	for _, q := range dev.queues {
		l.pumps.Go(func() { pump(q, l.sock) })
	}
	l.pumps.Go(func() { pump(l.sock, dev.queues[0]) })
	return l, nil
}

// tapMTU is the TAP's MTU (cocoon copies the CNI interface's MTU to it); the guest interface
// gets the same, as a guest sees its virtio-net device's.
func tapMTU(tap string) int {
	if link, err := netlink.LinkByName(tap); err == nil && link.Attrs().MTU > 0 {
		return link.Attrs().MTU
	}
	return defaultMTU
}

// openSocket brings the relay end up and binds a packet socket to it. The socket is created
// inside the relay namespace, where the interface lives.
func (l *nicLink) openSocket(relayNS netns.NsHandle) error {
	link, err := l.relay.LinkByName(l.relayName)
	if err != nil {
		return fmt.Errorf("find %s: %w", l.relayName, err)
	}
	if err := l.relay.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", l.relayName, err)
	}
	var fd int
	err = nsthread.In(relayNS, func() error {
		// Protocol 0 receives nothing until bind narrows the socket to one interface.
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	sock := os.NewFile(uintptr(fd), "packet:"+l.relayName)
	if err := bindPacketSocket(fd, link.Attrs().Index); err != nil {
		_ = sock.Close()
		return fmt.Errorf("packet socket on %s: %w", l.relayName, err)
	}
	l.sock = sock
	return nil
}

func bindPacketSocket(fd, ifindex int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return fmt.Errorf("PACKET_VNET_HDR: %w", err)
	}
	// Frames the relay itself writes must not come back to it.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return fmt.Errorf("PACKET_IGNORE_OUTGOING: %w", err)
	}
	return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// pump moves frames, each with its virtio-net header, from src to dst until src fails (closed,
// or its read deadline passed) or dst is closed. A frame dst refuses otherwise is dropped, as a
// NIC drops what it cannot queue.
func pump(src, dst *os.File) {
	buf := make([]byte, maxRelayFrame)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if n <= virtioNetHdrLen {
			continue
		}
		if _, err := dst.Write(buf[:n]); errors.Is(err, os.ErrClosed) {
			return
		}
	}
}

// close stops relaying and deletes the veth pair, and the guest interface with it. The TAP
// queues stay open (they are the hypervisor's): their readers are woken by an expired deadline,
// which is lifted again once they have returned.
func (l *nicLink) close() {
	if l.sock != nil {
		_ = l.sock.Close()
	}
	for _, q := range l.dev.queues {
		_ = q.SetReadDeadline(time.Now())
	}
	l.pumps.Wait()
	for _, q := range l.dev.queues {
		_ = q.SetReadDeadline(time.Time{})
	}
	if link, err := l.relay.LinkByName(l.relayName); err == nil {
		_ = l.relay.LinkDel(link)
	}
	l.relay.Close()
}

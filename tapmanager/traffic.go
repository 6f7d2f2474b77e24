package tapmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Traffic is what a watch of a pod's traffic offers (TrafficWatch).
type Traffic interface {
	// Seen reports whether the pod sent or received anything since the last call.
	Seen() (bool, error)
	// WaitForUse returns once a packet to the pod, or an ARP request for its address, came.
	WaitForUse(ctx context.Context) error
	Close() error
}

// WatchTraffic opens a TrafficWatch (below) on the pod interface in the VM namespace at vmNetNS.
func (m *Manager) WatchTraffic(vmNetNS string, podIP net.IP) (Traffic, error) {
	return WatchTraffic(vmNetNS, podIP)
}

// TrafficWatch is a packet socket on the pod interface in a VM's namespace, where the interface is
// while a VM holds it. It sees the pod's packets in both directions before tc hands them to the
// VM's TAP, so it works whether or not a hypervisor reads the TAP: the hibernation of an idle pod
// counts traffic with it while the VM runs, and waits on it for the packet that wakes the VM.
//
// The kernel filters in place (classic BPF), so the pod's traffic costs a filter run per packet
// and nothing is copied to cocoon-cri but the first bytes of a packet that matches; the socket's
// receive buffer is as small as the kernel allows, so a busy pod fills it at once and further
// packets are only counted.
type TrafficWatch struct {
	file  *os.File
	podIP net.IP
}

// snapLen is what the socket keeps of a matching packet: nothing of it is read.
const snapLen = 64

// WatchTraffic opens a watch on the pod interface (VMIfName) in the namespace at vmNetNS. podIP is
// the pod's IPv4 address: an ARP request for it wakes a hibernated pod (WaitForUse), since a
// client that has forgotten the pod's MAC sends nothing else until someone answers.
func WatchTraffic(vmNetNS string, podIP net.IP) (*TrafficWatch, error) {
	fd, err := packetSocketIn(vmNetNS, VMIfName)
	if err != nil {
		return nil, fmt.Errorf("watch the traffic of %s in %s: %w", VMIfName, vmNetNS, err)
	}
	w := &TrafficWatch{file: os.NewFile(uintptr(fd), "packet:"+vmNetNS), podIP: podIP.To4()}
	if err := w.setFilter(trafficFilter(nil)); err != nil {
		w.Close() //nolint:errcheck
		return nil, err
	}
	// What the socket took before its filter and binding is dropped, and its count with it.
	if _, err := w.Seen(); err != nil {
		w.Close() //nolint:errcheck
		return nil, err
	}
	return w, nil
}

// packetSocketIn opens a non-blocking packet socket in the namespace at path and binds it to the
// interface named ifName there. It is opened for no protocol, so it takes no packet of any
// interface until its binding names one.
func packetSocketIn(path, ifName string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread enters the namespace; if it cannot come back, it dies with the goroutine.
		runtime.LockOSThread()
		fd, err := func() (int, error) {
			target, err := netns.GetFromPath(path)
			if err != nil {
				return -1, err
			}
			defer target.Close() //nolint:errcheck
			origin, err := netns.Get()
			if err != nil {
				return -1, err
			}
			defer origin.Close() //nolint:errcheck
			if err := netns.Set(target); err != nil {
				return -1, err
			}
			fd, err := openBoundPacketSocket(ifName)
			if backErr := netns.Set(origin); backErr != nil {
				if fd >= 0 {
					unix.Close(fd) //nolint:errcheck
				}
				return -1, fmt.Errorf("return from the namespace: %w", backErr)
			}
			runtime.UnlockOSThread()
			return fd, err
		}()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

func openBoundPacketSocket(ifName string) (int, error) {
	iface, err := net.InterfaceByName(ifName)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	// The kernel rounds it up to its minimum.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1); err != nil {
		unix.Close(fd) //nolint:errcheck
		return -1, fmt.Errorf("packet socket buffer: %w", err)
	}
	// Drop everything until the real filter is set.
	if err := attachFilter(fd, []bpf.Instruction{bpf.RetConstant{Val: 0}}); err != nil {
		unix.Close(fd) //nolint:errcheck
		return -1, err
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: iface.Index}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd) //nolint:errcheck
		return -1, fmt.Errorf("bind to %s: %w", ifName, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Ethernet frame offsets the filter reads.
const (
	offEtherType   = 12
	offARPOp       = 20 // 14 + 6
	offARPTargetIP = 38 // 14 + 24
	offIPv6Next    = 20 // 14 + 6
	offICMPv6Type  = 54 // 14 + 40
)

// trafficFilter accepts IPv4 and IPv6 packets, except IPv6 neighbour discovery and multicast
// listener messages (ICMPv6 types 130 to 137 and 143: the kernel sends them itself when a link
// comes up), and, when arpFor is set, ARP requests for that address. Everything else (ARP otherwise, LLDP, ...) is dropped:
// the neighbour protocols run on their own timers and say nothing about use.
func trafficFilter(arpFor net.IP) []bpf.Instruction {
	// Jumps are written by label and resolved below.
	type jump struct {
		cond    bpf.JumpTest
		val     uint32
		yes, no string // labels, or "next"
	}
	prog := []any{
		bpf.LoadAbsolute{Off: offEtherType, Size: 2},
		jump{cond: bpf.JumpEqual, val: unix.ETH_P_IP, yes: "accept", no: "next"},
		jump{cond: bpf.JumpEqual, val: unix.ETH_P_IPV6, yes: "ipv6", no: "next"},
		jump{cond: bpf.JumpEqual, val: unix.ETH_P_ARP, yes: "arp", no: "drop"},
		"ipv6",
		bpf.LoadAbsolute{Off: offIPv6Next, Size: 1},
		jump{cond: bpf.JumpEqual, val: unix.IPPROTO_ICMPV6, yes: "next", no: "accept"},
		bpf.LoadAbsolute{Off: offICMPv6Type, Size: 1},
		jump{cond: bpf.JumpEqual, val: 143, yes: "drop", no: "next"},
		jump{cond: bpf.JumpGreaterOrEqual, val: 130, yes: "next", no: "accept"},
		jump{cond: bpf.JumpGreaterThan, val: 137, yes: "accept", no: "drop"},
		"arp",
	}
	if arpFor != nil {
		prog = append(prog,
			bpf.LoadAbsolute{Off: offARPOp, Size: 2},
			jump{cond: bpf.JumpEqual, val: 1, yes: "next", no: "drop"},
			bpf.LoadAbsolute{Off: offARPTargetIP, Size: 4},
			jump{cond: bpf.JumpEqual, val: uint32(arpFor[0])<<24 | uint32(arpFor[1])<<16 | uint32(arpFor[2])<<8 | uint32(arpFor[3]), yes: "accept", no: "drop"},
		)
	}
	prog = append(prog, "drop", bpf.RetConstant{Val: 0}, "accept", bpf.RetConstant{Val: snapLen})

	labels := map[string]int{}
	n := 0
	for _, p := range prog {
		if name, ok := p.(string); ok {
			labels[name] = n
			continue
		}
		n++
	}
	var out []bpf.Instruction
	for _, p := range prog {
		switch p := p.(type) {
		case string:
		case jump:
			here := len(out)
			skip := func(label string) uint8 {
				if label == "next" {
					return 0
				}
				return uint8(labels[label] - here - 1)
			}
			out = append(out, bpf.JumpIf{Cond: p.cond, Val: p.val, SkipTrue: skip(p.yes), SkipFalse: skip(p.no)})
		case bpf.Instruction:
			out = append(out, p)
		}
	}
	return out
}

func attachFilter(fd int, prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("assemble the packet filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
		return fmt.Errorf("attach the packet filter: %w", err)
	}
	return nil
}

func (w *TrafficWatch) setFilter(prog []bpf.Instruction) error {
	raw, err := w.file.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = attachFilter(int(fd), prog) }); err != nil {
		return err
	}
	return ferr
}

// Seen reports whether any packet of the pod (ARP and neighbour discovery aside) passed since the
// last call, and empties the socket.
func (w *TrafficWatch) Seen() (bool, error) {
	raw, err := w.file.SyscallConn()
	if err != nil {
		return false, err
	}
	var stats *unix.TpacketStats
	var serr error
	err = raw.Control(func(fd uintptr) {
		buf := make([]byte, snapLen)
		for {
			if _, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT); err != nil {
				break
			}
		}
		// The kernel resets the counts as it reports them; packets counts the dropped ones too.
		stats, serr = unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return false, fmt.Errorf("read the packet count: %w", err)
	}
	return stats.Packets > 0, nil
}

// WaitForUse waits, within ctx, for a packet to or from the pod, or an ARP request for its
// address, and returns nil once one came. Packets before the call do not count.
func (w *TrafficWatch) WaitForUse(ctx context.Context) error {
	if err := w.setFilter(trafficFilter(w.podIP)); err != nil {
		return err
	}
	defer w.setFilter(trafficFilter(nil)) //nolint:errcheck
	if _, err := w.Seen(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { w.file.SetReadDeadline(time.Now()) }) //nolint:errcheck
	defer func() {
		stop()
		w.file.SetReadDeadline(time.Time{}) //nolint:errcheck
	}()
	buf := make([]byte, snapLen)
	_, err := w.file.Read(buf)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ctx.Err()
	default:
		return fmt.Errorf("wait for the pod's traffic: %w", err)
	}
}

// Close closes the socket; a WaitForUse in flight returns.
func (w *TrafficWatch) Close() error { return w.file.Close() }

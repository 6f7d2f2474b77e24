package tapmanager

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// counterSockets keeps a netlink socket open in each pod namespace whose counters are read: the
// kubelet asks for every pod's every few seconds, and opening a socket in a namespace (entering it
// and coming back) costs several times the query. A socket holds its namespace alive, so
// RemoveNetNS closes the namespace's socket first and none is opened while it goes.
type counterSockets struct {
	mu       sync.Mutex
	sockets  map[string]*counterSocket
	removing map[string]bool
}

// counterSocket is a route netlink socket in one pod namespace, and the pod interface's index
// there once looked up. mu keeps it to one query at a time, and from being closed during one.
type counterSocket struct {
	mu      sync.Mutex
	handle  *nl.SocketHandle
	ifindex uint32
	closed  bool
}

// errNamespaceGoing is returned for a namespace RemoveNetNS is removing.
var errNamespaceGoing = errors.New("the namespace is being removed")

// counterTimeout bounds a query: the kernel answers at once, and a stuck socket must not hold the
// kubelet's stats call.
var counterTimeout = unix.Timeval{Sec: 5}

// PodInterfaceCounters reads the pod interface's counters in the pod's namespace, where it is
// while no VM holds it. A VM's hypervisor runs in the namespace that holds it then, and its
// /proc/<pid>/net/dev is the cheaper read.
func (n *NetNS) PodInterfaceCounters(podNetNS string) (vmstats.Interface, error) {
	s, err := n.counters.socket(podNetNS)
	if err != nil {
		return vmstats.Interface{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return vmstats.Interface{}, fmt.Errorf("counters of %s: %w", podNetNS, errNamespaceGoing)
	}
	st, err := s.counters()
	if err != nil {
		return vmstats.Interface{}, fmt.Errorf("counters of %s in %s: %w", PodIfName, podNetNS, err)
	}
	st.Name = PodIfName
	return st, nil
}

// counters asks for the interface's 64-bit counters alone (RTM_GETSTATS): the kernel then fills
// a few dozen bytes, where a link query (RTM_GETLINK) makes it describe the whole link, at
// several times the cost. The index is looked up by name once. An interface a VM held and gave
// back may come back under another index; the old one then names no interface (the namespace
// has only it and the loopback, index 1), and the index is looked up again.
func (s *counterSocket) counters() (vmstats.Interface, error) {
	for attempt := 0; ; attempt++ {
		if s.ifindex == 0 {
			idx, err := s.lookupIndex(PodIfName)
			if err != nil {
				return vmstats.Interface{}, err
			}
			s.ifindex = idx
		}
		st, err := s.stats64(s.ifindex)
		if errors.Is(err, unix.ENODEV) && attempt == 0 {
			s.ifindex = 0
			continue
		}
		return st, err
	}
}

func (s *counterSocket) request(proto int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(proto, 0)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: s.handle}
	return req
}

func (s *counterSocket) lookupIndex(name string) (uint32, error) {
	req := s.request(unix.RTM_GETLINK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return 0, fmt.Errorf("find %s: %w", name, err)
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return 0, fmt.Errorf("find %s: the kernel answered %d messages", name, len(msgs))
	}
	return uint32(nl.DeserializeIfInfomsg(msgs[0]).Index), nil
}

// sizeofIfStatsMsg is struct if_stats_msg: family, two pad fields, ifindex, filter_mask.
const sizeofIfStatsMsg = 12

func (s *counterSocket) stats64(ifindex uint32) (vmstats.Interface, error) {
	hdr := make([]byte, sizeofIfStatsMsg)
	nl.NativeEndian().PutUint32(hdr[4:], ifindex)
	nl.NativeEndian().PutUint32(hdr[8:], 1<<(unix.IFLA_STATS_LINK_64-1))
	req := s.request(unix.RTM_GETSTATS)
	req.AddRawData(hdr)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWSTATS)
	if err != nil {
		return vmstats.Interface{}, err
	}
	if len(msgs) != 1 || len(msgs[0]) < sizeofIfStatsMsg {
		return vmstats.Interface{}, fmt.Errorf("the kernel answered %d messages", len(msgs))
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][sizeofIfStatsMsg:])
	if err != nil {
		return vmstats.Interface{}, fmt.Errorf("parse the counters: %w", err)
	}
	for _, a := range attrs {
		// struct rtnl_link_stats64 starts with rx_packets, tx_packets, rx_bytes, tx_bytes,
		// rx_errors, tx_errors, each a u64.
		if a.Attr.Type != unix.IFLA_STATS_LINK_64 || len(a.Value) < 48 {
			continue
		}
		u64 := func(i int) uint64 { return nativeUint64(a.Value[i*8:]) }
		return vmstats.Interface{RxBytes: u64(2), TxBytes: u64(3), RxErrors: u64(4), TxErrors: u64(5)}, nil
	}
	return vmstats.Interface{}, errors.New("the kernel gave no counters")
}

func nativeUint64(b []byte) uint64 {
	if nl.NativeEndian() == binary.ByteOrder(binary.LittleEndian) {
		return binary.LittleEndian.Uint64(b)
	}
	return binary.BigEndian.Uint64(b)
}

// socket is the namespace's socket, opened at its first use.
func (c *counterSockets) socket(path string) (*counterSocket, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removing[path] {
		return nil, fmt.Errorf("counters of %s: %w", path, errNamespaceGoing)
	}
	if s := c.sockets[path]; s != nil {
		return s, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	if err := sock.SetReceiveTimeout(&counterTimeout); err != nil {
		sock.Close()
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	if c.sockets == nil {
		c.sockets = map[string]*counterSocket{}
	}
	s := &counterSocket{handle: &nl.SocketHandle{Socket: sock}}
	c.sockets[path] = s
	return s, nil
}

// closeFor closes the namespace's socket, once a query in flight is done, and keeps another from
// opening until done is called.
func (c *counterSockets) closeFor(path string) (done func()) {
	c.mu.Lock()
	s := c.sockets[path]
	delete(c.sockets, path)
	if c.removing == nil {
		c.removing = map[string]bool{}
	}
	c.removing[path] = true
	c.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.handle.Socket.Close()
		s.closed = true
		s.mu.Unlock()
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.removing, path)
	}
}

package tapmanager

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
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
	handles  map[string]*netlink.Handle
	removing map[string]bool
}

// errNamespaceGoing is returned for a namespace RemoveNetNS is removing.
var errNamespaceGoing = errors.New("the namespace is being removed")

// PodInterfaceCounters reads the pod interface's counters in the pod's namespace, where it is
// while no VM holds it. A VM's hypervisor runs in the namespace that holds it then, and its
// /proc/<pid>/net/dev is the cheaper read.
func (n *NetNS) PodInterfaceCounters(podNetNS string) (vmstats.Interface, error) {
	c := &n.counters
	// Held across the query too: a socket is not to be closed while it is used.
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle(podNetNS)
	if err != nil {
		return vmstats.Interface{}, err
	}
	link, err := h.LinkByName(PodIfName)
	if err != nil {
		return vmstats.Interface{}, fmt.Errorf("find %s in %s: %w", PodIfName, podNetNS, err)
	}
	st := link.Attrs().Statistics
	if st == nil {
		return vmstats.Interface{}, fmt.Errorf("%s in %s: the kernel gave no counters", PodIfName, podNetNS)
	}
	return vmstats.Interface{Name: PodIfName, RxBytes: st.RxBytes, RxErrors: st.RxErrors, TxBytes: st.TxBytes, TxErrors: st.TxErrors}, nil
}

// handle is the namespace's socket, opened at its first use. The caller holds c.mu.
func (c *counterSockets) handle(path string) (*netlink.Handle, error) {
	if c.removing[path] {
		return nil, fmt.Errorf("counters of %s: %w", path, errNamespaceGoing)
	}
	if h := c.handles[path]; h != nil {
		return h, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	if c.handles == nil {
		c.handles = map[string]*netlink.Handle{}
	}
	c.handles[path] = h
	return h, nil
}

// closeFor closes the namespace's socket and keeps another from opening until done is called.
func (c *counterSockets) closeFor(path string) (done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.handles[path]; h != nil {
		h.Close()
		delete(c.handles, path)
	}
	if c.removing == nil {
		c.removing = map[string]bool{}
	}
	c.removing[path] = true
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.removing, path)
	}
}

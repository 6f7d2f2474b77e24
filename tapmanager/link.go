package tapmanager

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
)

// The pod interface stays in the pod's namespace for the pod's life. A VM's namespace gets a veth
// pair's end in its place, the other end in the pod's namespace, and tc sends every frame from one
// to the other: moving a link between namespaces waits for RCU grace periods under the RTNL lock
// (BenchmarkMoveLink), making a pair across two namespaces does not (BenchmarkHandOver). Interfaces
// that cocoon-cri before this moved into a VM's namespace are still found there and taken back.
// docs/networking.md, "The life of a pod's interface".

// prepareLink readies the pod interface for a link to the VM at vmNetNS: brought home if a VM of
// an earlier cocoon-cri holds it, and the record saying it is wired to vmNetNS before any wiring,
// so that a crash anywhere leaves it to be undone (restoreWired).
func prepareLink(podNetNS, holderFile, vmNetNS string) error {
	if err := bringHome(podNetNS, holderFile, vmNetNS); err != nil {
		return err
	}
	return writeRecord(holderFile, holderRecord{At: podNetNS, WiredTo: vmNetNS})
}

// bringHome moves the pod interface into the pod's namespace from the VM namespace the record
// names, where an earlier cocoon-cri moved it; one at home stays. The record says, before the
// move, that it is to be wired to vmNetNS: a crash between the move and the next record leaves the
// wiring to be undone, not an interface nobody restores.
func bringHome(podNetNS, holderFile, vmNetNS string) error {
	if home, err := hasLink(podNetNS, PodIfName); err != nil || home {
		return err
	}
	at := readHolder(holderFile)
	if at == "" || at == podNetNS {
		return fmt.Errorf("the pod interface %s is neither in %s nor held by a VM", PodIfName, podNetNS)
	}
	if err := writeRecord(holderFile, holderRecord{At: at, WiredTo: vmNetNS}); err != nil {
		return err
	}
	return moveLink(at, VMIfName, podNetNS, PodIfName)
}

// linkAlias marks the VM's end of a pair: it stands for the pod interface in the VM's namespace and
// is never taken for it (a reclaim leaves it, and it goes with the VM's namespace). The end a pool
// VM is cloned onto is marked placeholderAlias instead.
const linkAlias = "cocoon-cri pod interface link"

// isPodInterface tells the pod's own interface from what stands in for it in a VM's namespace: a
// pair's end, or a pool VM's placeholder.
func isPodInterface(link netlink.Link) bool {
	alias := link.Attrs().Alias
	return alias != placeholderAlias && alias != linkAlias
}

// linkEndName names the pod's end of the pair to the VM at vmNetNS: an interface name (at most 15
// bytes) that differs between the VMs a sandbox has had, whose ends stay until their namespaces go.
func linkEndName(vmNetNS string) string {
	sum := sha256.Sum256([]byte(vmNetNS))
	return "ccri" + hex.EncodeToString(sum[:])[:11]
}

// linkToVM makes the pair between the pod interface's namespace and the VM's, its VM end named
// ifName with the pod interface's MAC and MTU (cocoon gives the guest NIC that MAC), and tc's
// wiring: pod interface <-> pair, and with wireTAP, for a VM that runs already, pair <-> TAP
// (cocoon wires its new VM's TAP itself). The pod interface loses its addresses: the guest owns
// them. A repeat finds the work done.
func linkToVM(podNetNS, vmNetNS, ifName string, wireTAP bool) error {
	podNS, err := netns.GetFromPath(podNetNS)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", podNetNS, err)
	}
	defer podNS.Close()
	end := linkEndName(vmNetNS)
	return withHandle(podNetNS, func(pod *netlink.Handle) error {
		iface, err := pod.LinkByName(PodIfName)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", PodIfName, podNetNS, err)
		}
		if err := flushAddresses(pod, iface); err != nil {
			return err
		}
		err = withHandle(vmNetNS, func(vm *netlink.Handle) error {
			vmEnd, err := vm.LinkByName(ifName)
			if err != nil {
				if vmEnd, err = makeVMEnd(vm, podNS, iface, ifName, end); err != nil {
					return err
				}
			}
			if err := silenceIPv6(vm, vmEnd); err != nil {
				return err
			}
			if err := vm.LinkSetUp(vmEnd); err != nil {
				return fmt.Errorf("set %s up: %w", ifName, err)
			}
			if wireTAP {
				return wireToTAP(vm)
			}
			return nil
		})
		if err != nil {
			return err
		}
		peer, err := pod.LinkByName(end)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", end, podNetNS, err)
		}
		if err := silenceIPv6(pod, peer); err != nil {
			return err
		}
		if err := pod.LinkSetUp(peer); err != nil {
			return fmt.Errorf("set %s up: %w", end, err)
		}
		for _, pair := range [][2]netlink.Link{{iface, peer}, {peer, iface}} {
			if err := redirectAll(pod, pair[0], pair[1]); err != nil {
				return err
			}
		}
		return nil
	})
}

// silenceIPv6 keeps a pair's end, before it comes up, from making an IPv6 link-local address, and
// so from sending neighbour and router solicitations of its own: the VM's end has the pod's MAC,
// and what reaches the pod's link and the guest must be the guest's and the node's alone. A node
// without IPv6 has nothing to silence.
func silenceIPv6(h *netlink.Handle, link netlink.Link) error {
	err := h.LinkSetIP6AddrGenMode(link, nl.IN6_ADDR_GEN_MODE_NONE)
	if err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
		return fmt.Errorf("turn off IPv6 address generation on %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// linkNewName is the VM's end of a pair until it is marked and can take the pod interface's name:
// the kernel takes an alias only from a change, not at a link's creation, and an unmarked link
// named as the pod interface would be taken for it after a crash (isPodInterface).
const linkNewName = "ccri-new"

// makeVMEnd makes the pair to iface, its VM end named ifName once marked (a link is renamed only
// while down, as it is made). A repeat after a crash finds the unmarked end and goes on from there.
func makeVMEnd(vm *netlink.Handle, podNS netns.NsHandle, iface netlink.Link, ifName, podEnd string) (netlink.Link, error) {
	if _, err := vm.LinkByName(linkNewName); err != nil {
		attrs := netlink.LinkAttrs{Name: linkNewName, MTU: iface.Attrs().MTU, HardwareAddr: iface.Attrs().HardwareAddr}
		pair := &netlink.Veth{LinkAttrs: attrs, PeerName: podEnd, PeerNamespace: netlink.NsFd(podNS)}
		if err := vm.LinkAdd(pair); err != nil {
			return nil, fmt.Errorf("add the pair %s-%s: %w", linkNewName, podEnd, err)
		}
	}
	alias := linkAlias
	if isPlaceholder(iface) {
		alias = placeholderAlias
	}
	link, err := vm.LinkByName(linkNewName)
	if err == nil {
		err = vm.LinkSetAlias(link, alias)
	}
	if err == nil {
		err = vm.LinkSetName(link, ifName)
	}
	if err != nil {
		return nil, fmt.Errorf("mark the pair's end %s as %s: %w", linkNewName, ifName, err)
	}
	return link, nil
}

// RestorePodInterface undoes the wiring of the pod interface for the cluster's CNI DEL, which
// releases what it finds on it (a bridge's masquerade rules go by its addresses), when the record
// says it is wired: a VM's removal restores it (the attach plugin's DEL), but a pool VM's removal
// does not (cocoon runs the DEL with the pool's configuration), nor one cocoon lost.
func (m *Manager) RestorePodInterface(sandboxID, podNetNS string, result json.RawMessage) error {
	holderFile := m.holderFile(sandboxID)
	if readRecord(holderFile).WiredTo == "" {
		return nil
	}
	res, err := DecodeResult(result)
	if err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	if err := restoreWired(podNetNS, res); err != nil {
		return err
	}
	faultpoint.Hit("pod interface restored")
	return writeHolder(holderFile, podNetNS)
}

// restoreWired gives the pod interface at home what the cluster's CNI gave it: tc lets go of it,
// and result's addresses and routes are back. One that is not at home, or whose namespace is gone,
// is left alone.
func restoreWired(podNetNS string, result *current.Result) error {
	if _, err := os.Stat(podNetNS); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := withHandle(podNetNS, func(h *netlink.Handle) error {
		iface, err := h.LinkByName(PodIfName)
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return errNotHome
		} else if err != nil {
			return fmt.Errorf("look up %s: %w", PodIfName, err)
		}
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: iface.Attrs().Index, Parent: netlink.HANDLE_INGRESS}}
		if err := h.QdiscDel(ingress); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove the ingress qdisc of %s: %w", PodIfName, err)
		}
		return nil
	})
	if errors.Is(err, errNotHome) {
		return nil
	}
	if err == nil {
		err = restoreAddresses(podNetNS, result)
	}
	if err != nil {
		return fmt.Errorf("restore the pod interface in %s: %w", podNetNS, err)
	}
	return nil
}

var errNotHome = errors.New("the pod interface is not in the pod's namespace")

// wireToTAP makes the pod interface (VMIfName) and the VM's TAP one wire: no addresses on the
// interface (the guest owns them), the TAP at its MTU, and every frame arriving on one sent out of
// the other.
func wireToTAP(h *netlink.Handle) error {
	link, err := h.LinkByName(VMIfName)
	if err != nil {
		return err
	}
	tap, err := vmTAP(h)
	if err != nil {
		return err
	}
	if err := flushAddresses(h, link); err != nil {
		return err
	}
	if mtu := link.Attrs().MTU; mtu > 0 && tap.Attrs().MTU != mtu {
		if err := h.LinkSetMTU(tap, mtu); err != nil {
			return fmt.Errorf("set the TAP's MTU to %d: %w", mtu, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return err
	}
	for _, pair := range [][2]netlink.Link{{link, tap}, {tap, link}} {
		if err := redirectAll(h, pair[0], pair[1]); err != nil {
			return err
		}
	}
	return nil
}

// flushAddresses removes every address of link.
func flushAddresses(h *netlink.Handle, link netlink.Link) error {
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, addr := range addrs {
		if err := h.AddrDel(link, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("flush %s from %s: %w", addr.IPNet, link.Attrs().Name, err)
		}
	}
	return nil
}

// vmTAP is the TAP cocoon made in a VM's namespace.
func vmTAP(h *netlink.Handle) (netlink.Link, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if l.Type() == "tuntap" {
			return l, nil
		}
	}
	return nil, errors.New("the VM's namespace has no TAP")
}

// redirectAll replaces whatever from's ingress does with one filter that sends every frame out of
// to.
func redirectAll(h *netlink.Handle, from, to netlink.Link) error {
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from.Attrs().Index, Parent: netlink.HANDLE_INGRESS}}
	if err := h.QdiscAdd(ingress); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	filters, err := h.FilterList(from, netlink.HANDLE_INGRESS)
	if err != nil {
		return fmt.Errorf("list filters of %s: %w", from.Attrs().Name, err)
	}
	for _, f := range filters {
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove a filter of %s: %w", from.Attrs().Name, err)
		}
	}
	err = h.FilterAdd(&netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: from.Attrs().Index, Parent: netlink.HANDLE_INGRESS, Priority: 1, Protocol: syscall.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{}}},
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to.Attrs().Index,
		}},
	})
	if err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

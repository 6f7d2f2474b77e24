package tapmanager

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
)

// A warm pool VM is cloned before any pod exists, so it cannot be given a pod's interface. It is
// cloned onto a placeholder instead: one end of a veth pair in a namespace of its own (a dummy
// interface would do, but not every kernel has the module), handed to cocoon
// by the same attach plugin, so cocoon wires the VM's TAP to it exactly as to a pod's interface.
// HandOver later puts the pod's interface where the placeholder was. docs/design.md, "Warm pools".

// placeholderAlias marks the placeholder (ip link's alias, which stays with a link that changes
// namespace), so that it is never taken for a pod's interface.
const placeholderAlias = "cocoon-cri warm pool placeholder"

// placeholderPeer is the other end of the placeholder's veth pair, which stays in the pool VM's
// namespace: removing that namespace removes the pair, wherever the placeholder is.
const placeholderPeer = "placeholder"

func isPlaceholder(link netlink.Link) bool { return link.Attrs().Alias == placeholderAlias }

// placeholderAddress is the address in a pool VM's placeholder CNI result. cocoon wants one; the
// guest never gets it (a clone keeps its snapshot's addresses until its set-up), and it is from
// TEST-NET-1 (RFC 5737), which is never routed.
var placeholderAddress = net.IPNet{IP: net.IPv4(192, 0, 2, 1).To4(), Mask: net.CIDRMask(32, 32)}

// PreparePoolVM makes the network a pool VM is cloned onto: namespace NetNSPath(id) holding the
// placeholder, and cocoon's configuration (CocoonConfDir(id)) that hands it over. The namespace must
// stay while the VM holds the placeholder. Something left by an earlier try is replaced.
func (m *Manager) PreparePoolVM(id string) error {
	path := m.NetNSPath(id)
	if err := m.RemovePoolVM(id); err != nil {
		return err
	}
	if err := m.CreateNetNS(path); err != nil {
		return err
	}
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return err
	}
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	err := withHandle(path, func(h *netlink.Handle) error {
		pair := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: PodIfName, HardwareAddr: mac}, PeerName: placeholderPeer}
		if err := h.LinkAdd(pair); err != nil {
			return fmt.Errorf("add placeholder %s: %w", PodIfName, err)
		}
		if err := h.LinkSetAlias(pair, placeholderAlias); err != nil {
			return fmt.Errorf("mark placeholder %s: %w", PodIfName, err)
		}
		return h.LinkSetUp(pair)
	})
	if err != nil {
		return fmt.Errorf("placeholder interface in %s: %w", path, err)
	}
	zero := 0
	result, err := json.Marshal(&current.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*current.Interface{{Name: PodIfName, Mac: mac.String(), Sandbox: path}},
		IPs:        []*current.IPConfig{{Interface: &zero, Address: placeholderAddress}},
	})
	if err != nil {
		return err
	}
	return m.PrepareCocoon(id, path, result)
}

// RemovePoolVM removes what PreparePoolVM made; what is already gone is fine.
func (m *Manager) RemovePoolVM(id string) error {
	return errors.Join(m.RemoveNetNS(m.NetNSPath(id)), m.RemoveCocoon(id))
}

// HandOver gives a running pool VM the sandbox's pod interface in place of its placeholder, without
// moving it: a move between namespaces waits for RCU grace periods under the RTNL lock (13 to 28
// ms, docs/profiles.md), while a veth pair made across two namespaces does not. The placeholder is
// set aside (renamed; it goes with its pair when RemovePoolVM removes the pool VM's namespace), a
// pair is made with one end in the VM's namespace, named as the pod interface there (cocoon, the
// traffic watch and the stats find it as they would the moved interface), and the other in the
// pod's; tc sends every frame of the pod interface into the pair and out of it, and from the pair's
// other end to the VM's TAP, both ways. The pod interface loses its addresses (the guest owns
// them) until RestorePodInterface gives them back. Only an interface a previous VM of the sandbox
// still holds is moved, home. The guest's NIC keeps the placeholder's MAC until the guest set-up
// gives it the pod's. A repeat finds the work done.
func (m *Manager) HandOver(sandboxID, podNetNS, vmNetNS string) error {
	placeholder, err := lookupLink(vmNetNS, VMIfName)
	if err == nil && placeholder != nil && isPlaceholder(placeholder) {
		err = withHandle(vmNetNS, func(h *netlink.Handle) error {
			if err := h.LinkSetDown(placeholder); err != nil {
				return err
			}
			return h.LinkSetName(placeholder, placeholderPeer)
		})
	}
	if err != nil {
		return fmt.Errorf("set the placeholder aside in %s: %w", vmNetNS, err)
	}
	faultpoint.Hit("placeholder set aside")
	holderFile := m.holderFile(sandboxID)
	if err := bringHome(podNetNS, holderFile, vmNetNS); err != nil {
		return err
	}
	// Written before the wiring, which RestorePodInterface undoes by this record.
	if err := writeRecord(holderFile, holderRecord{At: podNetNS, WiredTo: vmNetNS}); err != nil {
		return err
	}
	faultpoint.Hit("pod interface handed over")
	if err := linkToVM(podNetNS, vmNetNS); err != nil {
		return fmt.Errorf("wire the pod interface to the VM in %s: %w", vmNetNS, err)
	}
	return nil
}

// bringHome moves the pod interface into the pod's namespace from the previous VM of the sandbox
// that still holds it, which the record names; one at home stays. The record says, before the
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

// linkAlias marks the VM's end of the pair HandOver makes: it stands for the pod interface in the
// VM's namespace and is never taken for it (a reclaim leaves it, and it goes with the VM).
const linkAlias = "cocoon-cri pod interface link"

// isPodInterface tells the pod's own interface from what stands in for it in a VM's namespace: a
// pool VM's placeholder, or the VM's end of a hand-over's pair.
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

// linkToVM makes the pair between the pod interface's namespace and the VM's, and the tc wiring:
// pod interface <-> pair <-> TAP.
func linkToVM(podNetNS, vmNetNS string) error {
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
			if _, err := vm.LinkByName(VMIfName); err != nil {
				if err := makeVMEnd(vm, podNS, end, iface.Attrs().MTU); err != nil {
					return err
				}
			}
			return wireToTAP(vm)
		})
		if err != nil {
			return err
		}
		peer, err := pod.LinkByName(end)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", end, podNetNS, err)
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

// linkNewName is the VM's end of a hand-over's pair until it is marked (linkAlias) and can take the
// pod interface's name: the kernel takes an alias only from a change, not at a link's creation, and
// an unmarked link named as the pod interface would be taken for it after a crash (isPodInterface).
const linkNewName = "ccri-new"

// makeVMEnd makes the pair, its VM end named VMIfName once marked, down (a link is renamed only
// while down). A repeat after a crash finds the unmarked end and goes on from there.
func makeVMEnd(vm *netlink.Handle, podNS netns.NsHandle, podEnd string, mtu int) error {
	if _, err := vm.LinkByName(linkNewName); err != nil {
		pair := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: linkNewName, MTU: mtu}, PeerName: podEnd, PeerNamespace: netlink.NsFd(podNS)}
		if err := vm.LinkAdd(pair); err != nil {
			return fmt.Errorf("add the pair %s-%s: %w", linkNewName, podEnd, err)
		}
	}
	link, err := vm.LinkByName(linkNewName)
	if err == nil {
		err = vm.LinkSetAlias(link, linkAlias)
	}
	if err == nil {
		err = vm.LinkSetName(link, VMIfName)
	}
	if err != nil {
		return fmt.Errorf("mark the pair's end %s as %s: %w", linkNewName, VMIfName, err)
	}
	return nil
}

// RestorePodInterface undoes a hand-over's wiring of the pod interface in the pod's namespace, for
// the cluster's CNI DEL, which releases what it finds on it (a bridge's masquerade rules go by its
// addresses): tc let go of it, and result's addresses and routes back. An interface that no hand-over
// wired, or that a VM holds now, is left as it is.
func (m *Manager) RestorePodInterface(sandboxID, podNetNS string, result json.RawMessage) error {
	holderFile := m.holderFile(sandboxID)
	if readRecord(holderFile).WiredTo == "" {
		return nil
	}
	res, err := DecodeResult(result)
	if err != nil {
		return fmt.Errorf("read the pod's CNI result: %w", err)
	}
	err = withHandle(podNetNS, func(h *netlink.Handle) error {
		iface, err := h.LinkByName(PodIfName)
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil
		} else if err != nil {
			return fmt.Errorf("look up %s: %w", PodIfName, err)
		}
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: iface.Attrs().Index, Parent: netlink.HANDLE_INGRESS}}
		if err := h.QdiscDel(ingress); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove the ingress qdisc of %s: %w", PodIfName, err)
		}
		return nil
	})
	if err == nil {
		err = restoreAddresses(podNetNS, res)
	}
	if err != nil {
		return fmt.Errorf("restore the pod interface in %s: %w", podNetNS, err)
	}
	faultpoint.Hit("pod interface restored")
	return writeHolder(holderFile, podNetNS)
}

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

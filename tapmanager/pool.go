package tapmanager

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
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

// HandOver gives a running pool VM the sandbox's pod interface in place of its placeholder: the
// placeholder is set aside (renamed; it goes with its pair when RemovePoolVM removes the pool
// VM's namespace, so the hand-over does not wait for a link's deletion), the pod interface moved into the VM's namespace (from the pod's, or
// from a previous VM of the sandbox that still holds it) and stripped of its addresses, and tc
// wires it to the VM's TAP both ways, as cocoon does at a clone. The guest's NIC keeps the
// placeholder's MAC until the guest set-up gives it the pod's. A repeat finds the work done.
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
	conf := &attachConf{PodNetNS: podNetNS, HolderFile: m.holderFile(sandboxID)}
	if err := takeInterface(conf, vmNetNS, VMIfName); err != nil {
		return err
	}
	if err := writeHolder(conf.HolderFile, vmNetNS); err != nil {
		return err
	}
	faultpoint.Hit("pod interface handed over")
	if err := withHandle(vmNetNS, wireToTAP); err != nil {
		return fmt.Errorf("wire the pod interface to the VM in %s: %w", vmNetNS, err)
	}
	return nil
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
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", VMIfName, err)
	}
	for _, addr := range addrs {
		if err := h.AddrDel(link, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("flush %s from %s: %w", addr.IPNet, VMIfName, err)
		}
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

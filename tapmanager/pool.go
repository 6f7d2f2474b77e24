package tapmanager

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
)

// A warm pool VM is cloned before any pod exists, so it cannot be given a pod's interface. It is
// cloned onto a placeholder instead: one end of a veth pair in a namespace of its own (a dummy
// interface would do, but not every kernel has the module), which the same attach plugin links to
// the VM as it links a pod's interface, so cocoon wires the VM's TAP to it exactly as to a pod's.
// HandOver later links the pod's interface in the placeholder's place. docs/design.md, "Warm pools".

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
// placeholder (the VM's end of a pair to the pool VM's own namespace) is set aside, renamed, and
// goes with its pair when RemovePoolVM removes that namespace; a pair to the pod's namespace takes
// its place, wired to the VM's TAP, as the attach plugin links a new VM's (link.go). The guest's NIC
// keeps the placeholder's MAC until the guest set-up gives it the pod's. A repeat finds the work
// done.
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
	if err := prepareLink(podNetNS, m.holderFile(sandboxID), vmNetNS); err != nil {
		return err
	}
	faultpoint.Hit("pod interface handed over")
	if err := linkToVM(podNetNS, vmNetNS, VMIfName, true); err != nil {
		return fmt.Errorf("wire the pod interface to the VM in %s: %w", vmNetNS, err)
	}
	return nil
}

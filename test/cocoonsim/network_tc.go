package cocoonsim

import (
	"fmt"
	"net"
	"syscall"

	cns "github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// setupTCRedirect turns the CNI interface ifName inside the VM's netns into a wire to a new TAP:
// the guest NIC takes over the interface's MAC (or overrideMAC, when a recovery restores the
// persisted one) and MTU, the interface loses its addresses, and tc moves every frame between
// the two devices in both directions. It returns the MAC the guest must use.
func setupTCRedirect(nsPath, ifName, tapName string, numQueues int, overrideMAC string) (string, error) {
	var mac string
	err := cns.WithNetNSPath(nsPath, func(cns.NetNS) error {
		var err error
		mac, err = tcRedirectInNS(ifName, tapName, numQueues, overrideMAC)
		return err
	})
	return mac, err
}

func tcRedirectInNS(ifName, tapName string, numQueues int, overrideMAC string) (string, error) {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return "", fmt.Errorf("find %s: %w", ifName, err)
	}
	if overrideMAC != "" {
		hw, err := net.ParseMAC(overrideMAC)
		if err != nil {
			return "", fmt.Errorf("parse MAC %s: %w", overrideMAC, err)
		}
		if err := netlink.LinkSetHardwareAddr(link, hw); err != nil {
			return "", fmt.Errorf("set MAC on %s: %w", ifName, err)
		}
		if link, err = netlink.LinkByName(ifName); err != nil {
			return "", fmt.Errorf("re-read link %s: %w", ifName, err)
		}
	}
	mac := link.Attrs().HardwareAddr.String()

	// The guest owns the address now; the host side of the wire must not answer for it.
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return "", fmt.Errorf("list addrs on %s: %w", ifName, err)
	}
	for _, addr := range addrs {
		if err := netlink.AddrDel(link, &addr); err != nil {
			return "", fmt.Errorf("flush addr %s on %s: %w", addr.IPNet, ifName, err)
		}
	}

	if err := createTAP(tapName, numQueues); err != nil {
		return "", fmt.Errorf("add tap %s: %w", tapName, err)
	}
	tap, err := netlink.LinkByName(tapName)
	if err != nil {
		return "", fmt.Errorf("find tap %s: %w", tapName, err)
	}
	tuneTAP(tap)
	if mtu := link.Attrs().MTU; mtu > 0 {
		if err := netlink.LinkSetMTU(tap, mtu); err != nil {
			return "", fmt.Errorf("set tap %s mtu %d: %w", tapName, mtu, err)
		}
	}
	for _, l := range []netlink.Link{link, tap} {
		if err := netlink.LinkSetUp(l); err != nil {
			return "", fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	for _, l := range []netlink.Link{link, tap} {
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_INGRESS}}
		if err := netlink.QdiscAdd(ingress); err != nil {
			return "", fmt.Errorf("add ingress qdisc on %s: %w", l.Attrs().Name, err)
		}
	}
	if err := redirectIngress(link, tap); err != nil {
		return "", fmt.Errorf("redirect %s -> %s: %w", ifName, tapName, err)
	}
	if err := redirectIngress(tap, link); err != nil {
		return "", fmt.Errorf("redirect %s -> %s: %w", tapName, ifName, err)
	}
	return mac, nil
}

// redirectIngress steals every frame arriving on from and sends it out of to: a u32 filter that
// matches everything, with a mirred egress-redirect action.
func redirectIngress(from, to netlink.Link) error {
	matchAll := &netlink.TcU32Sel{
		Flags: netlink.TC_U32_TERMINAL,
		Keys:  []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0, OffMask: 0}},
	}
	return netlink.FilterAdd(&netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    netlink.HANDLE_INGRESS,
			Priority:  1,
			Protocol:  syscall.ETH_P_ALL,
		},
		Sel: matchAll,
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to.Attrs().Index,
		}},
	})
}

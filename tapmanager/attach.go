package tapmanager

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	cnitypes "github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/atomicfile"
)

// AttachPluginName is the CNI plugin type cocoon-cri serves: cocoon runs it (CNI ADD in the VM's
// namespace) when it creates a pod's VM, and it links the VM's namespace to the interface the
// cluster's CNI configured in the pod's namespace (link.go). cocoon then does what it does for any
// CNI: flushes the interface's addresses, wires it to the VM's TAP and gives the guest its MAC and
// IP.
const AttachPluginName = "cocoon-cri-attach"

// attachConf is the plugin's entry in the conflist cocoon-cri writes for a sandbox.
type attachConf struct {
	cnitypes.PluginConf
	// PodNetNS is the pod's own namespace, where the interface lives.
	PodNetNS string `json:"podNetNS"`
	// HolderFile records which VM's namespace the interface is wired to, and, for an interface an
	// earlier cocoon-cri moved into a VM's namespace, that namespace.
	HolderFile string `json:"holderFile"`
	// PodResult is the cluster CNI's ADD result for the pod: the addresses cocoon gives the guest.
	PodResult json.RawMessage `json:"podResult"`
}

// AttachPluginMain runs the plugin; cocoon-cri's main calls it when invoked as AttachPluginName.
func AttachPluginMain() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: attachAdd, Del: attachDel, Check: attachCheck},
		version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "cocoon-cri attach: hands a pod's network interface to its cocoon VM")
}

func parseAttachConf(data []byte) (*attachConf, *current.Result, error) {
	conf := &attachConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, nil, fmt.Errorf("parse configuration: %w", err)
	}
	if conf.PodNetNS == "" || len(conf.PodResult) == 0 {
		return nil, nil, errors.New("configuration lacks podNetNS or podResult")
	}
	result, err := DecodeResult(conf.PodResult)
	if err != nil {
		return nil, nil, fmt.Errorf("parse podResult: %w", err)
	}
	return conf, result, nil
}

func attachAdd(args *skel.CmdArgs) error {
	conf, result, err := parseAttachConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := prepareLink(conf.PodNetNS, conf.HolderFile, args.Netns); err != nil {
		return err
	}
	if err := linkToVM(conf.PodNetNS, args.Netns, args.IfName, false); err != nil {
		return err
	}
	if iface := podInterface(result); iface != nil {
		iface.Name, iface.Sandbox = args.IfName, args.Netns
	}
	return cnitypes.PrintResult(result, conf.CNIVersion)
}

// attachDel, as vm rm runs it, gives the pod interface back what the cluster's CNI gave it when it
// is wired to this VM, or takes it back from this VM's namespace where an earlier cocoon-cri moved
// it. The pair goes with the VM's namespace.
func attachDel(args *skel.CmdArgs) error {
	conf, result, err := parseAttachConf(args.StdinData)
	if err != nil {
		return err
	}
	if args.Netns == "" {
		// The VM's namespace is gone, and the pair with it; the pod's stop restores the rest.
		return nil
	}
	if readRecord(conf.HolderFile).WiredTo == args.Netns {
		if err := restoreWired(conf.PodNetNS, result); err != nil {
			return err
		}
		return writeHolder(conf.HolderFile, conf.PodNetNS)
	}
	if held, err := holds(args.Netns, args.IfName); err != nil || !held {
		// A later VM of the pod is wired to the interface: the record stands.
		return err
	}
	if err := Reclaim(conf.PodNetNS, args.Netns, args.IfName, result); err != nil {
		return err
	}
	return writeHolder(conf.HolderFile, conf.PodNetNS)
}

func attachCheck(args *skel.CmdArgs) error {
	has, err := hasLink(args.Netns, args.IfName)
	if err != nil {
		return err
	}
	if !has {
		return fmt.Errorf("%s is not in %s", args.IfName, args.Netns)
	}
	return nil
}

// Reclaim moves the pod interface from a VM's namespace (where it is vmIfName) back into the pod's
// namespace and gives it back the addresses and routes of result, so the pod's namespace is as the
// cluster's CNI left it. An interface that is not there (already reclaimed, or gone with its
// namespace) is not an error.
func Reclaim(podNetNS, vmNetNS, vmIfName string, result *current.Result) error {
	if vmNetNS == "" {
		return nil
	}
	if _, err := os.Stat(vmNetNS); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// A warm pool VM's placeholder, or the pair a hand-over made, is no pod's interface: it goes
	// with the VM.
	link, err := lookupLink(vmNetNS, vmIfName)
	if err != nil || link == nil || !isPodInterface(link) {
		return err
	}
	if err := moveLink(vmNetNS, vmIfName, podNetNS, PodIfName); err != nil {
		return err
	}
	return restoreAddresses(podNetNS, result)
}

// withHandle runs fn with a netlink handle inside the namespace at path.
func withHandle(path string, fn func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

func hasLink(nsPath, name string) (bool, error) {
	link, err := lookupLink(nsPath, name)
	return link != nil, err
}

// lookupLink finds interface name in the namespace at nsPath; nil if there is none.
func lookupLink(nsPath, name string) (netlink.Link, error) {
	var link netlink.Link
	err := withHandle(nsPath, func(h *netlink.Handle) error {
		found, err := h.LinkByName(name)
		var notFound netlink.LinkNotFoundError
		switch {
		case err == nil:
			link = found
		case errors.As(err, &notFound):
		default:
			return fmt.Errorf("look up %s in %s: %w", name, nsPath, err)
		}
		return nil
	})
	return link, err
}

// moveLink moves interface name from one namespace to another, renaming it to newName there, and
// brings it up. A move clears its addresses and qdiscs: the receiver configures it afresh.
func moveLink(fromNS, name, toNS, newName string) error {
	dst, err := netns.GetFromPath(toNS)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", toNS, err)
	}
	defer dst.Close()
	err = withHandle(fromNS, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", name, fromNS, err)
		}
		if err := h.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
		return h.LinkSetNsFd(link, int(dst))
	})
	if err != nil {
		return fmt.Errorf("move %s from %s to %s: %w", name, fromNS, toNS, err)
	}
	return withHandle(toNS, func(h *netlink.Handle) error {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find moved %s in %s: %w", name, toNS, err)
		}
		if name != newName {
			if err := h.LinkSetName(link, newName); err != nil {
				return fmt.Errorf("rename %s to %s: %w", name, newName, err)
			}
		}
		return h.LinkSetUp(link)
	})
}

// restoreAddresses puts the result's addresses and routes back on the pod interface.
func restoreAddresses(podNetNS string, result *current.Result) error {
	return withHandle(podNetNS, func(h *netlink.Handle) error {
		link, err := h.LinkByName(PodIfName)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", PodIfName, podNetNS, err)
		}
		for _, ip := range result.IPs {
			addr := &netlink.Addr{IPNet: ipNet(*ip)}
			if ip.Address.IP.To4() == nil {
				// The address was checked for duplicates when the cluster's CNI assigned it.
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := h.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("restore address %s: %w", addr.IPNet, err)
			}
		}
		for _, r := range result.Routes {
			route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &r.Dst, Gw: r.GW}
			if err := h.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("restore route to %s: %w", r.Dst.String(), err)
			}
		}
		return nil
	})
}

// holderRecord is the holder file: the namespace that holds the pod interface and, while a warm
// pool hand-over has it wired to a VM from the pod's namespace (HandOver), that VM's namespace.
type holderRecord struct {
	At, WiredTo string
}

const wiredPrefix = "wired to "

func readRecord(path string) holderRecord {
	data, err := os.ReadFile(path)
	if err != nil {
		return holderRecord{}
	}
	at, wired, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
	return holderRecord{At: at, WiredTo: strings.TrimPrefix(wired, wiredPrefix)}
}

func readHolder(path string) string { return readRecord(path).At }

// writeRecord records where the interface is, atomically. Not synced: the namespaces it names
// and the interface itself do not outlive the boot.
func writeRecord(path string, r holderRecord) error {
	if path == "" {
		return nil
	}
	data := r.At + "\n"
	if r.WiredTo != "" {
		data += wiredPrefix + r.WiredTo + "\n"
	}
	if err := atomicfile.Replace(path, []byte(data), 0o600); err != nil {
		return fmt.Errorf("record interface holder: %w", err)
	}
	return nil
}

// writeHolder records that the namespace at nsPath holds the interface, as cocoon's CNI or a move
// left it: a move drops what tc did to it, and cocoon or a reclaim configures it afresh.
func writeHolder(path, nsPath string) error { return writeRecord(path, holderRecord{At: nsPath}) }

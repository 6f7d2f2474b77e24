package cocoonsim

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// printPostCloneHints prints, on stdout, the guest commands cocoon suggests after a clone
// without -o json (cmd/vm/run.go printPostCloneHints). The text is part of the output contract.
func printPostCloneHints(w io.Writer, vm *cocoon.VM, nets []*cocoon.NetworkConfig) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) } //nolint:errcheck
	if vm.Config.Windows {
		p("")
		p("Windows clone: NICs hot-swapped with new MAC addresses.")
		p("  DHCP networks: no action needed.")
		p("  Static IP: configure via SAC serial console (cocoon vm console):")
		p("    https://github.com/cloud-hypervisor/cloud-hypervisor/blob/main/docs/windows.md")
		p("")
		return
	}
	p("")
	p("Run inside the guest to finish setup:")
	p("")
	p("  # Release memory for balloon")
	p("  echo 3 > /proc/sys/vm/drop_caches")
	if vm.Hypervisor == cocoon.HypervisorFirecracker {
		p("")
		p("  # Fix guest MAC addresses (FC clone retains source VM's MAC)")
		for i, nc := range nets {
			if nc != nil && nc.Mac != "" {
				p("  ip link set dev eth%d down", i)
				p("  ip link set dev eth%d address %s", i, nc.Mac)
				p("  ip link set dev eth%d up", i)
			}
		}
	}
	p("")
	p("  # Clean old network configs from snapshot and write new ones (MAC-based)")
	p("  rm -f /etc/systemd/network/10-*.network")
	if vm.Config.ImageType == cocoon.ImageTypeCloudImg {
		p("  cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init")
		p("  cloud-init modules --mode=config && systemctl restart systemd-networkd")
	} else {
		printOCINetworkHints(p, vm, nets)
	}
	p("")
}

func printOCINetworkHints(p func(string, ...any), vm *cocoon.VM, nets []*cocoon.NetworkConfig) {
	p("")
	p("  # Set hostname")
	p("  hostnamectl set-hostname %s", vm.Config.Name)
	var static []*cocoon.NetworkConfig
	var dhcp []string
	for _, nc := range nets {
		switch {
		case nc == nil || nc.Mac == "":
		case nc.Network != nil && nc.Network.IP != "":
			static = append(static, nc)
		default:
			dhcp = append(dhcp, nc.Mac)
		}
	}
	if len(static) > 0 {
		array := func(name string, field func(*cocoon.NetworkConfig) string) {
			items := make([]string, len(static))
			for i, nc := range static {
				items[i] = "'" + field(nc) + "'"
			}
			p("  %s=(%s)", name, strings.Join(items, " "))
		}
		array("macs", func(nc *cocoon.NetworkConfig) string { return nc.Mac })
		array("addrs", func(nc *cocoon.NetworkConfig) string { return fmt.Sprintf("%s/%d", nc.Network.IP, nc.Network.Prefix) })
		hasGW := slices.ContainsFunc(static, func(nc *cocoon.NetworkConfig) bool { return nc.Network.Gateway != "" })
		if hasGW {
			array("gws", func(nc *cocoon.NetworkConfig) string { return nc.Network.Gateway })
		}
		p(`  for i in "${!macs[@]}"; do`)
		p(`    f="/etc/systemd/network/10-${macs[$i]//:/}.network"`)
		p(`    printf '[Match]\nMACAddress=%%s\n\n[Network]\nAddress=%%s\n' "${macs[$i]}" "${addrs[$i]}" > "$f"`)
		if hasGW {
			p(`    [ -n "${gws[$i]}" ] && printf 'Gateway=%%s\n' "${gws[$i]}" >> "$f"`)
		}
		p("  done")
	}
	if len(dhcp) > 0 {
		p("  # DHCP NICs")
		for _, mac := range dhcp {
			p(`  printf '[Match]\nMACAddress=%s\n\n[Network]\nDHCP=ipv4\n' > "/etc/systemd/network/10-%s.network"`, mac, strings.ReplaceAll(mac, ":", ""))
		}
	}
	if len(static) > 0 || len(dhcp) > 0 {
		p("  systemctl restart systemd-networkd")
	}
}

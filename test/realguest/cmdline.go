package realguest

import (
	"fmt"
	"net"
	"net/netip"
)

// IPArgs are the kernel arguments cocoon gives a direct-boot guest with one NIC (cocoon's
// hypervisor.BuildIPParams): "cocoon.hostname=<name> ip=<ip>::<gw>:<netmask>:<name>:eth0:off"
// followed by ":<dns0>[:<dns1>]" when there are DNS servers (a third is dropped, as cocoon does).
// gw may be the zero Addr: no default route.
func IPArgs(hostname string, addr netip.Prefix, gw netip.Addr, dns ...netip.Addr) string {
	gateway := ""
	if gw.IsValid() {
		gateway = gw.String()
	}
	mask := net.IP(net.CIDRMask(addr.Bits(), addr.Addr().BitLen())).String()
	ip := fmt.Sprintf("ip=%s::%s:%s:%s:eth0:off", addr.Addr(), gateway, mask, hostname)
	for _, d := range dns[:min(len(dns), 2)] {
		ip += ":" + d.String()
	}
	return "cocoon.hostname=" + hostname + " " + ip
}

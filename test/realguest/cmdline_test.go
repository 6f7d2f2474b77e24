package realguest

import (
	"net/netip"
	"testing"
)

// The arguments must read exactly as cocoon's hypervisor.BuildIPParams writes them for eth0.
func TestIPArgsMatchCocoon(t *testing.T) {
	addr := netip.MustParsePrefix("10.88.1.7/20")
	gw := netip.MustParseAddr("10.88.0.1")
	dns := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("1.1.1.1")}
	for _, tc := range []struct {
		name string
		gw   netip.Addr
		dns  []netip.Addr
		want string
	}{
		{"no dns", gw, nil, "cocoon.hostname=vm1 ip=10.88.1.7::10.88.0.1:255.255.240.0:vm1:eth0:off"},
		{"one dns", gw, dns[:1], "cocoon.hostname=vm1 ip=10.88.1.7::10.88.0.1:255.255.240.0:vm1:eth0:off:10.96.0.10"},
		{"two of three dns", gw, dns, "cocoon.hostname=vm1 ip=10.88.1.7::10.88.0.1:255.255.240.0:vm1:eth0:off:10.96.0.10:8.8.8.8"},
		{"no gateway", netip.Addr{}, nil, "cocoon.hostname=vm1 ip=10.88.1.7:::255.255.240.0:vm1:eth0:off"},
	} {
		if got := IPArgs("vm1", addr, tc.gw, tc.dns...); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

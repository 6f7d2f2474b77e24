package cocoonsim_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

func TestExecRunsInTheGuestsNetworkWithItsFiles(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "ip")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	vm := lab.runVM("img", "web", "--cpu", "1")
	ip := vm.NetworkConfigs[0].Network.IP

	if got := lab.inGuest("web", "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, " inet "+ip+"/24 ") {
		t.Fatalf("ip addr in the guest: %q, want %s/24", got, ip)
	}
	// cocoon-cri finds the pod's NIC by its MAC in sysfs.
	if got := lab.inGuest("web", "sh", "-c", "cd /sys/class/net && echo * && cat eth0/address"); got != "eth0 lo\n"+vm.NetworkConfigs[0].Mac+"\n" {
		t.Fatalf("the guest's /sys/class/net: %q", got)
	}
	// What the boot configuration says: cocoon.hostname= and the DNS servers of ip=.
	if got := lab.inGuest("web", "sh", "-c", "hostname; cat /etc/hostname /etc/resolv.conf; grep web /etc/hosts"); got != "web\nweb\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n127.0.1.1\tweb\n" {
		t.Fatalf("the guest's identity: %q", got)
	}
	hostBefore := snapshotHostFiles(t)
	lab.inGuest("web", "sh", "-c", "hostname renamed && echo 'nameserver 10.99.0.1' > /etc/resolv.conf")
	lab.mustProbe(lab.ns, ip, "renamed "+ip)
	if got := lab.inGuest("web", "cat", "/etc/resolv.conf"); got != "nameserver 10.99.0.1\n" {
		t.Fatalf("resolv.conf after writing it in the guest: %q", got)
	}
	if got := snapshotHostFiles(t); got != hostBefore {
		t.Fatalf("the host's files changed:\nbefore %s\nafter  %s", hostBefore, got)
	}
	lab.ok("vm", "rm", "--force", "web")
	lab.checkNoNetworkLeft()
}

// cocoon-cri gives a clone its own address through vm exec, as a clone resumes with the
// snapshot's: the guest's network changes live, and its services follow.
func TestExecReconfiguresAClonesNetwork(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "ip")
	lab := newNetLab(t, labOptions{})
	lab.seedImage("img", guest.Spec{})
	src := lab.runVM("img", "src", "--cpu", "1")
	srcIP := src.NetworkConfigs[0].Network.IP
	lab.ok("snapshot", "save", "--name", "snap", "src")
	lab.ok("vm", "rm", "--force", "src")

	clone := lab.clone("snap", "copy")
	nc := clone.NetworkConfigs[0].Network
	lab.mustProbe(lab.ns, srcIP, "src "+srcIP)
	// As cocoon-cri does it: the NIC found by the MAC cocoon gave it.
	lab.inGuest("copy", "sh", "-c", fmt.Sprintf(`set -e
for d in /sys/class/net/*; do [ "$(cat $d/address)" = %s ] && dev=${d##*/}; done
ip link set "$dev" up
ip addr flush dev "$dev"
ip addr add %s/%d dev "$dev"
ip route replace default via %s dev "$dev"
hostname copy
echo copy > /etc/hostname
printf 'nameserver %s\n' > /etc/resolv.conf`,
		clone.NetworkConfigs[0].Mac, nc.IP, nc.Prefix, nc.Gateway, nc.Gateway))
	lab.mustProbe(lab.ns, nc.IP, "copy "+nc.IP)
	if got := lab.inGuest("copy", "ip", "route", "show", "default"); !strings.HasPrefix(got, "default via "+nc.Gateway+" dev eth0") {
		t.Fatalf("default route in the guest: %q", got)
	}
	if got, err := lab.probe(srcIP); err == nil {
		t.Fatalf("the snapshot's address still answers: %q", got)
	}
	lab.ok("vm", "rm", "--force", "copy")
	lab.checkNoNetworkLeft()
}

package cocoonsim_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nocloud"
)

// labDNS are cocoon's default DNS servers, which the tests' simulators keep.
var labDNS = []string{"8.8.8.8", "1.1.1.1"}

// seedOf reads a cloud image VM's cloud-init seed as its guest does, and checks that the VM's
// record attaches it read-only.
func (s *sim) seedOf(vm cocoon.VM) (path string, seed *nocloud.Seed) {
	s.t.Helper()
	i := slices.IndexFunc(vm.StorageConfigs, func(sc *cocoon.StorageConfig) bool { return sc.Role == cocoon.StorageRoleCidata })
	if i < 0 || !vm.StorageConfigs[i].RO || !strings.HasSuffix(vm.StorageConfigs[i].Path, "/"+vm.ID+"/cidata.img") {
		s.t.Fatalf("%s: no read-only cidata disk in %+v", vm.Config.Name, vm.StorageConfigs)
	}
	path = vm.StorageConfigs[i].Path
	seed, err := nocloud.Read(path)
	if err != nil {
		s.t.Fatalf("%s: %v", vm.Config.Name, err)
	}
	return path, seed
}

// checkSeed compares a VM's seed with what cocoon writes for cfg.
func (s *sim) checkSeed(vm cocoon.VM, cfg *nocloud.Config, rev nocloud.Revision) {
	s.t.Helper()
	path, seed := s.seedOf(vm)
	want := nocloud.Files(cfg, rev)
	for name, got := range map[string][]byte{nocloud.MetaDataFile: seed.MetaData, nocloud.UserDataFile: seed.UserData, nocloud.NetworkConfigFile: seed.NetworkConfig} {
		if string(got) != string(want[name]) {
			s.t.Errorf("%s %s:\n%s\nwant\n%s", vm.Config.Name, name, got, want[name])
		}
	}
	// An independent reader of FAT volumes, when installed (util-linux; hack/setup.sh installs it).
	if blkid, err := exec.LookPath("blkid"); err == nil {
		out, err := exec.Command(blkid, "-p", "-o", "export", path).CombinedOutput() //nolint:gosec // test tool
		if err != nil || !strings.Contains(string(out), "\nTYPE=vfat\n") || !strings.Contains(string(out), "\nLABEL=CIDATA\n") {
			s.t.Errorf("blkid %s: %v\n%s", path, err, out)
		}
	}
}

// nicsOf are a VM's NICs as cocoon hands them to its seed.
func nicsOf(vm cocoon.VM) []nocloud.NIC {
	var nics []nocloud.NIC
	for _, n := range vm.NetworkConfigs {
		nic := nocloud.NIC{MAC: n.Mac}
		if n.Network != nil {
			nic.IP, nic.Prefix, nic.Gateway = n.Network.IP, n.Network.Prefix, n.Network.Gateway
		}
		nics = append(nics, nic)
	}
	return nics
}

// TestCloudImageSeedFollowsTheRelease: vm create writes the seed of the release the simulator
// plays: the VM's ID and name, --user and --password, and the data disks cloud-init mounts.
func TestCloudImageSeedFollowsTheRelease(t *testing.T) {
	requireTool(t, "qemu-img")
	requireTool(t, "mkfs.ext4")
	for _, tc := range []struct {
		version string
		rev     nocloud.Revision
	}{{"0.3.8", nocloud.V038}, {"0.5.1", nocloud.V05}} {
		t.Run(tc.version, func(t *testing.T) {
			s := newSimAt(t, tc.version)
			s.importCloudImage("cloud", guest.Spec{})
			s.ok("vm", "create", "--name", "web.example", "--nics", "0", "--user", "dev", "--password", "s3cret",
				"--data-disk", "size=16M,name=logs", "--data-disk", "size=16M,fstype=none", "cloud")
			vm := s.inspect("web.example")
			s.checkSeed(vm, &nocloud.Config{
				InstanceID: vm.ID, Hostname: "web.example", Username: "dev", Password: "s3cret", DNS: labDNS,
				Mounts: []nocloud.Mount{{Device: "/dev/disk/by-id/virtio-logs", MountPoint: "/mnt/logs", FSType: "ext4", Options: "defaults,nofail"}},
			}, tc.rev)
		})
	}
}

// TestCNICloudImageCloneReadsItsOwnSeed: a cloud image VM boots with the hostname, address and
// DNS servers of its seed; its clone gets a seed of its own (its ID, name and NIC, no password),
// resumes with the source's identity and takes its own at its next cold boot.
func TestCNICloudImageCloneReadsItsOwnSeed(t *testing.T) {
	requireTool(t, "qemu-img")
	lab := newNetLab(t, labOptions{})
	lab.importCloudImage("cloud", guest.Spec{})
	src := lab.runVM("cloud", "src", "--cpu", "1")
	lab.checkSeed(src, &nocloud.Config{InstanceID: src.ID, Hostname: "src", Username: "root", Password: "cocoon", DNS: labDNS, Networks: nicsOf(src)}, nocloud.V05)
	srcIP := src.NetworkConfigs[0].Network.IP
	lab.mustProbe(lab.ns, srcIP, "src "+srcIP)
	const identity = "hostname; cat /etc/resolv.conf; ip -4 -o addr show dev eth0 | awk '{print $4}'; ip -4 route show default"
	if got, want := lab.inGuest("src", "sh", "-c", identity), "src\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n"+srcIP+"/24\ndefault via "+labGateway+" dev eth0 \n"; got != want {
		t.Fatalf("the source guest's identity:\n%q\nwant\n%q", got, want)
	}
	lab.ok("snapshot", "save", "--name", "snap", "src")
	lab.ok("vm", "rm", "--force", "src")

	clone := lab.clone("snap", "copy")
	cloneIP := clone.NetworkConfigs[0].Network.IP
	lab.checkSeed(clone, &nocloud.Config{InstanceID: clone.ID, Hostname: "copy", DNS: labDNS, Networks: nicsOf(clone)}, nocloud.V05)
	// cocoon's post-clone window: the restored guest goes on with the source's identity.
	lab.mustProbe(lab.ns, srcIP, "src "+srcIP)
	lab.ok("vm", "stop", "copy")
	lab.ok("vm", "start", "copy")
	lab.mustProbe(lab.ns, cloneIP, "copy "+cloneIP)
	if got, want := lab.inGuest("copy", "sh", "-c", identity), "copy\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n"+cloneIP+"/24\ndefault via "+labGateway+" dev eth0 \n"; got != want {
		t.Fatalf("the clone's identity after a cold boot:\n%q\nwant\n%q", got, want)
	}
	lab.ok("vm", "rm", "--force", "copy")
	lab.checkNoNetworkLeft()
}

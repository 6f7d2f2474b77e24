package guest

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/fat12"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nocloud"
)

func TestKernelCmdlineNetwork(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    guestNetwork
	}{
		{
			"console=hvc0 net.ifnames=0 cocoon.hostname=web ip=10.0.0.5::10.0.0.1:255.255.255.0:web:eth0:off:8.8.8.8:1.1.1.1",
			guestNetwork{Hostname: "web", DNS: []string{"8.8.8.8", "1.1.1.1"}, Interfaces: map[string]ipv4Config{"eth0": {Address: "10.0.0.5/24", Gateway: "10.0.0.1"}}},
		},
		{
			// No DNS fields; the hostname of ip= stands in for a missing cocoon.hostname=.
			"ip=10.0.0.6::10.0.0.1:255.255.0.0:db:eth0:off",
			guestNetwork{Hostname: "db", Interfaces: map[string]ipv4Config{"eth0": {Address: "10.0.0.6/16", Gateway: "10.0.0.1"}}},
		},
		{
			// The first ip= naming DNS servers sets them; a field that is no address is skipped.
			"ip=10.0.0.7::10.0.0.1:255.255.255.0:h:eth0:off ip=10.1.0.7::10.1.0.1:255.255.255.0:h:eth1:off:bad:9.9.9.9",
			guestNetwork{Hostname: "h", DNS: []string{"9.9.9.9"}, Interfaces: map[string]ipv4Config{
				"eth0": {Address: "10.0.0.7/24", Gateway: "10.0.0.1"},
				"eth1": {Address: "10.1.0.7/24", Gateway: "10.1.0.1"},
			}},
		},
	} {
		if got := parseKernelCmdline(tc.cmdline); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.cmdline, got, tc.want)
		}
	}
}

func writeSeed(t *testing.T, files map[string][]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), cidataFile)
	var img bytes.Buffer
	if err := fat12.Write(&img, nocloud.Label, files, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, img.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCidataNetwork: the guest applies the seed cocoon writes, of either release, by MAC.
func TestCidataNetwork(t *testing.T) {
	cfg := &nocloud.Config{
		InstanceID: "4f1d", Hostname: "ubuntu", Username: "root", Password: "pw", DNS: []string{"10.0.0.53", "1.1.1.1"},
		Networks: []nocloud.NIC{
			{MAC: "AA:BB:CC:00:00:01", IP: "10.0.0.9", Prefix: 24, Gateway: "10.0.0.1"},
			{MAC: "aa:bb:cc:00:00:02"}, // DHCP
			{MAC: "aa:bb:cc:00:00:03", IP: "10.1.0.9", Prefix: 16},
		},
	}
	nets := []Net{{Mac: "aa:bb:cc:00:00:01"}, {Mac: "aa:bb:cc:00:00:02"}, {Mac: "aa:bb:cc:00:00:03"}, {Mac: "aa:bb:cc:00:00:04"}}
	want := guestNetwork{Hostname: "ubuntu", DNS: []string{"10.0.0.53", "1.1.1.1"}, Interfaces: map[string]ipv4Config{
		"eth0": {Address: "10.0.0.9/24", Gateway: "10.0.0.1"},
		"eth2": {Address: "10.1.0.9/16"},
	}}
	for _, rev := range []nocloud.Revision{nocloud.V038, nocloud.V05} {
		got, err := readCidata(writeSeed(t, nocloud.Files(cfg, rev)), nets)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("revision %d: %+v, %v; want %+v", rev, got, err, want)
		}
	}

	// Without NICs cocoon writes no network-config: a hostname and nothing else.
	cfg.Networks = nil
	got, err := readCidata(writeSeed(t, nocloud.Files(cfg, nocloud.V05)), nil)
	if want := (guestNetwork{Hostname: "ubuntu", Interfaces: map[string]ipv4Config{}}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("no NICs: %+v, %v; want %+v", got, err, want)
	}

	// No seed (a Windows VM): nothing configured.
	got, err = readCidata(filepath.Join(t.TempDir(), cidataFile), nets)
	if want := (guestNetwork{Interfaces: map[string]ipv4Config{}}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("no seed: %+v, %v; want %+v", got, err, want)
	}
}

// TestCidataAsCloudInitReadsIt: hostnames and network-config forms cocoon does not write, read as
// cloud-init and netplan would.
func TestCidataAsCloudInitReadsIt(t *testing.T) {
	const userData = "#cloud-config\n"
	for _, tc := range []struct {
		metaData, networkConfig string
		want                    guestNetwork
	}{
		{"instance-id: i\nlocal-hostname: web.example.com\n", "", guestNetwork{Hostname: "web"}},
		{"instance-id: i\nlocal-hostname: 10.1.2.3\n", "", guestNetwork{Hostname: "ip-10-1-2-3"}},
		{"instance-id: i\nlocal-hostname: 1234\n", "", guestNetwork{Hostname: "1234"}},
		{"instance-id: i\n", "", guestNetwork{}},
		{
			// Under network:, by interface name, gateway4, and a fallback an earlier ID wins over.
			"{instance-id: i, local-hostname: h}\n",
			`network:
  version: 2
  ethernets:
    a-first:
      match: {name: "eth*", macaddress: "aa:bb:cc:00:00:02"}
      addresses: [10.2.0.5/24, "fd00::5/64"]
      gateway4: 10.2.0.1
      nameservers: {addresses: [10.2.0.53]}
    eth0:
      addresses: ["fd00::4/64", 10.0.0.4/8]
      routes: [{to: 0.0.0.0/0, via: 10.0.0.1}]
      nameservers: {addresses: [10.0.0.53, 10.2.0.53]}
    z:
      match: {name: "e*"}
      addresses: [192.0.2.1/24]
    by-driver:
      match: {driver: virtio_net}
      addresses: [192.0.2.2/24]
`,
			guestNetwork{Hostname: "h", DNS: []string{"10.0.0.53", "10.2.0.53"}, Interfaces: map[string]ipv4Config{
				"eth0": {Address: "10.0.0.4/8", Gateway: "10.0.0.1"},
				"eth1": {Address: "10.2.0.5/24", Gateway: "10.2.0.1"},
				"eth2": {Address: "192.0.2.1/24"},
			}},
		},
	} {
		files := map[string][]byte{nocloud.MetaDataFile: []byte(tc.metaData), nocloud.UserDataFile: []byte(userData)}
		if tc.networkConfig != "" {
			files[nocloud.NetworkConfigFile] = []byte(tc.networkConfig)
		}
		if tc.want.Interfaces == nil {
			tc.want.Interfaces = map[string]ipv4Config{}
		}
		got, err := readCidata(writeSeed(t, files), []Net{{Mac: "aa:bb:cc:00:00:01"}, {Mac: "aa:bb:cc:00:00:02"}, {Mac: "aa:bb:cc:00:00:03"}})
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q, %q:\n got %+v, %v\nwant %+v", tc.metaData, tc.networkConfig, got, err, tc.want)
		}
	}
}

// TestCidataRefusesWhatCocoonDoesNotWrite: the JSON seed the simulator once wrote, a version 1
// network-config and YAML that does not parse fail the boot.
func TestCidataRefusesWhatCocoonDoesNotWrite(t *testing.T) {
	jsonSeed := filepath.Join(t.TempDir(), cidataFile)
	if err := os.WriteFile(jsonSeed, []byte(`{"hostname":"ubuntu","dns":["10.0.0.53"],"networks":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	meta := []byte("instance-id: i\n")
	for name, path := range map[string]string{
		"json":          jsonSeed,
		"version 1":     writeSeed(t, map[string][]byte{nocloud.MetaDataFile: meta, nocloud.UserDataFile: nil, nocloud.NetworkConfigFile: []byte("version: 1\nconfig: []\n")}),
		"bad meta-data": writeSeed(t, map[string][]byte{nocloud.MetaDataFile: []byte("local-hostname: [\n"), nocloud.UserDataFile: nil}),
		"bad network":   writeSeed(t, map[string][]byte{nocloud.MetaDataFile: meta, nocloud.UserDataFile: nil, nocloud.NetworkConfigFile: []byte("version: 2\nethernets: [\n")}),
	} {
		if got, err := readCidata(path, []Net{{Mac: "aa:bb:cc:00:00:01"}}); err == nil {
			t.Errorf("%s: read as %+v", name, got)
		}
	}
}

package guest

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
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

func TestCidataNetwork(t *testing.T) {
	seed := filepath.Join(t.TempDir(), cidataFile)
	data := `{"hostname":"ubuntu","dns":["10.0.0.53"],"networks":[{"mac":"AA:BB:CC:00:00:01","network":{"ip":"10.0.0.9","gateway":"10.0.0.1","prefix":24}}]}`
	if err := os.WriteFile(seed, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readCidata(seed, []Net{{Mac: "aa:bb:cc:00:00:01"}})
	want := guestNetwork{Hostname: "ubuntu", DNS: []string{"10.0.0.53"}, Interfaces: map[string]ipv4Config{"eth0": {Address: "10.0.0.9/24", Gateway: "10.0.0.1"}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%+v, %v; want %+v", got, err, want)
	}
}

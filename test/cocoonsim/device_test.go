package cocoonsim_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/fakesysfs"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestDeviceAttach: v0.5's vm device attach passes a vfio-pci device through to a running VM and
// inspect lists it. One process holds an IOMMU group: another VM gets EBUSY until every device of
// the group is detached or the holder stops. A group with a member on a host driver is not
// viable. The flags and refusals are cocoon's.
func TestDeviceAttach(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	sys := t.TempDir()
	fakesysfs.AddPCIDevice(t, sys, "7", "0000:01:00.0", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "7", "0000:01:00.1", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "8", "0000:02:00.0", "nvidia")
	fakesysfs.AddPCIDevice(t, sys, "9", "0000:03:00.0", "vfio-pci")
	fakesysfs.AddPCIDevice(t, sys, "10", "0000:04:00.0", "")
	s.env = append(s.env, cocoonsim.SysfsEnv+"="+sys)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "box")
	s.clone("base", "other")

	out := s.ok("vm", "device", "attach", "box", "--pci", "01:00.0", "--id", "gpu", "-o", "json")
	var res map[string]string
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["id"] != "gpu" || res["pci"] != "01:00.0" || res["vm"] != "box" {
		t.Fatalf("attach -o json: %q (%v)", out, err)
	}
	out = s.ok("vm", "device", "attach", "box", "--pci", "/sys/bus/pci/devices/0000:01:00.1", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["id"] == "" || res["id"] == "gpu" {
		t.Fatalf("attach without --id: %q (%v): cloud-hypervisor names the device", out, err)
	}
	audio := res["id"]
	if got := attachedPCI(t, s, "box"); got != "gpu=0000:01:00.0 "+audio+"=0000:01:00.1" {
		t.Fatalf("inspect's attached_devices.devices: %q", got)
	}

	const apiError = "vm.add-device: PUT http://localhost/api/v1/vm.add-device → 500: vm.add-device: VFIO: "
	busy := apiError + "open /dev/vfio/7: device or resource busy"
	s.fails(busy, "vm", "device", "attach", "other", "--pci", "0000:01:00.0")
	for _, tc := range []struct {
		want string
		args []string
	}{
		{"device /sys/bus/pci/devices/0000:01:00.0 already attached (id=gpu)", []string{"--pci", "01:00.0"}},
		{`device id "gpu" already in use`, []string{"--pci", "03:00.0", "--id", "gpu"}},
		{apiError + "group 8 is not viable: device 0000:02:00.0 is bound to nvidia", []string{"--pci", "02:00.0"}},
		{apiError + `device 0000:04:00.0 is not bound to vfio-pci (driver "")`, []string{"--pci", "04:00.0"}},
		{"pci path /sys/bus/pci/devices/0000:05:00.0: no such file or directory", []string{"--pci", "05:00.0"}},
		{`id "cocoon-gpu" invalid: must match [A-Za-z0-9][A-Za-z0-9_.-]{0,63} and not start with cocoon-`, []string{"--pci", "03:00.0", "--id", "cocoon-gpu"}},
		{`pci "1:0.0" invalid: expect BDF (01:00.0 / 0000:01:00.0) or sysfs path`, []string{"--pci", "1:0.0"}},
		{`pci "/dev/vfio/7" invalid: absolute path must be under /sys/bus/pci/devices/`, []string{"--pci", "/dev/vfio/7"}},
		{`required flag(s) "pci" not set`, []string{"--id", "x"}},
	} {
		s.fails(tc.want, append([]string{"vm", "device", "attach", "box"}, tc.args...)...)
	}

	out = s.ok("vm", "device", "detach", "box", "--id", "gpu", "-o", "json")
	if !strings.Contains(out, `"id": "gpu"`) {
		t.Fatalf("detach -o json: %q", out)
	}
	s.fails(`device id "gpu" not attached`, "vm", "device", "detach", "box", "--id", "gpu")
	// The group is still held for the device left.
	s.fails(busy, "vm", "device", "attach", "other", "--pci", "0000:01:00.0")
	s.ok("vm", "device", "detach", "box", "--id", audio)
	if strings.Contains(s.ok("vm", "inspect", "box"), "attached_devices") {
		t.Fatal("inspect shows attached devices after both were detached")
	}
	s.ok("vm", "device", "attach", "other", "--pci", "0000:01:00.0", "--id", "gpu")
	s.fails(busy, "vm", "device", "attach", "box", "--pci", "0000:01:00.0")

	// A stop lets go of the group, and the device with it.
	s.ok("vm", "stop", "other")
	s.fails("vm is not running: vm "+s.inspect("other").ID+" is stopped: vm not running", "vm", "device", "attach", "other", "--pci", "03:00.0")
	s.ok("vm", "device", "attach", "box", "--pci", "0000:01:00.0", "--id", "gpu")

	old := newSimAt(t, "0.3.8")
	if r := old.cocoon("vm", "device", "--help"); strings.Contains(r.stdout, "attach") {
		t.Fatalf("v0.3.8 has vm device attach:\n%s", r.stdout)
	}
}

// attachedPCI is inspect's attached_devices.devices as "id=bdf ...".
func attachedPCI(t *testing.T, s *sim, vm string) string {
	t.Helper()
	var shown struct {
		AttachedDevices struct {
			Devices []struct{ ID, BDF string } `json:"devices"`
		} `json:"attached_devices"`
	}
	if err := json.Unmarshal([]byte(s.ok("vm", "inspect", vm)), &shown); err != nil {
		t.Fatal(err)
	}
	var pairs []string
	for _, d := range shown.AttachedDevices.Devices {
		pairs = append(pairs, d.ID+"="+d.BDF)
	}
	return strings.Join(pairs, " ")
}

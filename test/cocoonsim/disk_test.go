package cocoonsim_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestDiskAttach: v0.5's vm disk attach hot-adds a raw file to a running VM; the guest finds it
// at /dev/disk/by-id/virtio-<name>, reads and writes the file itself, and loses it at detach.
// The flags, refusals and inspect's attached_devices are cocoon's.
func TestDiskAttach(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "box")
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol1.raw")
	data := make([]byte, 1<<20)
	copy(data, "hello")
	if err := os.WriteFile(vol, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out := s.ok("vm", "disk", "attach", "box", "--path", vol, "--name", "vol1", "-o", "json")
	var res map[string]string
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["id"] != "cocoon-disk-vol1" || res["name"] != "vol1" || res["vm"] != "box" {
		t.Fatalf("attach -o json: %q (%v)", out, err)
	}
	if got := s.inGuest("box", "head", "-c", "5", "/dev/disk/by-id/virtio-vol1"); got != "hello" {
		t.Fatalf("the guest reads %q from the disk", got)
	}
	s.inGuest("box", "sh", "-c", "printf world | dd of=/dev/disk/by-id/virtio-vol1 bs=1 seek=10 conv=notrunc 2>/dev/null")
	if got, _ := os.ReadFile(vol); !bytes.Equal(got[10:15], []byte("world")) {
		t.Fatalf("the guest's write did not reach the file: %q", got[:16])
	}
	var shown struct {
		AttachedDevices struct {
			Disks []map[string]any `json:"disks"`
		} `json:"attached_devices"`
	}
	if err := json.Unmarshal([]byte(s.ok("vm", "inspect", "box")), &shown); err != nil || len(shown.AttachedDevices.Disks) != 1 ||
		shown.AttachedDevices.Disks[0]["name"] != "vol1" || shown.AttachedDevices.Disks[0]["path"] != vol {
		t.Fatalf("inspect's attached_devices: %+v (%v)", shown.AttachedDevices, err)
	}

	ro := filepath.Join(dir, "ro.raw")
	if err := os.WriteFile(ro, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s.ok("vm", "disk", "attach", "box", "--path", ro, "--name", "ro", "--readonly")
	if r := s.vmExec("", "box", "--", "sh", "-c", "printf x | dd of=/dev/disk/by-id/virtio-ro conv=notrunc"); r.code == 0 {
		t.Fatal("the guest wrote to a read-only disk")
	}

	for _, tc := range []struct {
		want string
		args []string
	}{
		{`disk name "vol1" already attached`, []string{"--path", filepath.Join(dir, "other"), "--name", "vol1"}},
		{`disk path "` + vol + `" already attached as "cocoon-disk-vol1"`, []string{"--path", vol, "--name", "again"}},
		{`name "Vol" invalid: must match ^[a-z][a-z0-9_-]{0,19}$`, []string{"--path", vol, "--name", "Vol"}},
		{`name "cocoon-x" invalid: must match ^[a-z][a-z0-9_-]{0,19}$`, []string{"--path", vol, "--name", "cocoon-x"}},
		{`path must be absolute, got "vol1.raw"`, []string{"--path", "vol1.raw", "--name", "x"}},
		{"disk path: lstat " + filepath.Join(dir, "missing") + ": no such file or directory", []string{"--path", filepath.Join(dir, "missing"), "--name", "x"}},
		{`directio must be on/off/auto, got "sometimes"`, []string{"--path", vol, "--name", "x", "--directio", "sometimes"}},
		{"required flag(s) \"name\" not set", []string{"--path", vol}},
	} {
		if tc.want == `disk name "vol1" already attached` {
			if err := os.WriteFile(filepath.Join(dir, "other"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s.fails(tc.want, append([]string{"vm", "disk", "attach", "box"}, tc.args...)...)
	}
	s.fails(`snapshot VM box: snapshot VM `+s.inspect("box").ID+`: hot-attached disk "vol1": detach before snapshot or hibernate`,
		"snapshot", "save", "--name", "withdisk", "box")

	out = s.ok("vm", "disk", "detach", "box", "--name", "vol1", "-o", "json")
	if !strings.Contains(out, `"name": "vol1"`) {
		t.Fatalf("detach -o json: %q", out)
	}
	if r := s.vmExec("", "box", "--", "test", "-e", "/dev/disk/by-id/virtio-vol1"); r.code == 0 {
		t.Fatal("the guest still has the detached disk")
	}
	s.fails(`disk "vol1" not attached`, "vm", "disk", "detach", "box", "--name", "vol1")
	s.ok("vm", "disk", "detach", "box", "--name", "ro")
	if strings.Contains(s.ok("vm", "inspect", "box"), "attached_devices") {
		t.Fatal("inspect shows attached devices after both were detached")
	}
	s.ok("vm", "stop", "box")
	s.fails("vm is not running: vm "+s.inspect("box").ID+" is stopped: vm not running", "vm", "disk", "attach", "box", "--path", vol, "--name", "vol1")

	old := newSimAt(t, "0.3.8")
	if r := old.cocoon("vm", "disk", "--help"); strings.Contains(r.stdout, "attach") {
		t.Fatalf("v0.3.8 has vm disk attach:\n%s", r.stdout)
	}
}

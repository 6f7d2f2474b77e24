package cocoonsim_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestFirecrackerClone: a clone of a Firecracker snapshot runs under a process that looks like
// Firecracker and serves its API (not cloud-hypervisor's), answers vm exec through its vsock
// socket, gets a fresh machine-id, and serves its console through cocoon's relay.
func TestFirecrackerClone(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	snap := s.importSnapshot(testimage.SnapshotOptions{Name: "fc", Hypervisor: cocoon.HypervisorFirecracker, CPU: 1, Memory: 512 << 20})
	s.fails("--nics override on clone is Cloud Hypervisor only (FC network_overrides retargets existing NICs, not resize)",
		"vm", "clone", "--name", "c", "--nics", "0", "fc")
	vm := s.clone("fc", "fc1")
	runDir := filepath.Dir(vm.SocketPath)
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", vm.PID))
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	want := []string{"firecracker", "--api-sock", vm.SocketPath, "--log-path", filepath.Join(s.log, "firecracker", vm.ID, "firecracker.log"), "--level", "Warning", "--id", vm.ID}
	if vm.Hypervisor != cocoon.HypervisorFirecracker || fmt.Sprint(args) != fmt.Sprint(want) || filepath.Base(runDir) != vm.ID || filepath.Base(filepath.Dir(runDir)) != "firecracker" {
		t.Fatalf("VM %+v runs %q, want %q under <run>/firecracker", vm, args, want)
	}
	if _, err := os.Stat(filepath.Join(runDir, "fc.pid")); err != nil {
		t.Fatal(err)
	}
	if code, body := apiGet(t, vm.SocketPath, "/api/v1/vm.info"); code != http.StatusBadRequest || !strings.Contains(body, "fault_message") {
		t.Fatalf("vm.info on Firecracker: %d %s", code, body)
	}
	if code, body := apiGet(t, vm.SocketPath, "/"); code != http.StatusOK || !strings.Contains(body, `"state":"Running"`) {
		t.Fatalf("instance info: %d %s", code, body)
	}
	eventually(t, "the clone's reseed", func() bool {
		return s.ok("vm", "exec", "fc1", "--", "cat", "/etc/machine-id") != testimage.SnapshotMachineID(snap.Name)+"\n"
	})

	console := filepath.Join(runDir, "console.sock")
	first := dialConsole(t, console)
	fmt.Fprint(first, "one\r")
	readUntil(t, first, "you typed: one")
	// One session at a time: a second client is heard only once the first hangs up.
	second := dialConsole(t, console)
	fmt.Fprint(second, "two\r")
	_ = second.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, _ := second.Read(make([]byte, 64)); n > 0 {
		t.Fatal("a second console client was served while the first was connected")
	}
	_ = first.Close()
	readUntil(t, second, "you typed: two")
}

// TestFirecrackerStop: vm stop is Ctrl-Alt-Del, which the guest answers by going down at once;
// a guest that ignores it is killed at the timeout. Either way the runtime files go and the relay
// ends.
func TestFirecrackerStop(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "fc", Hypervisor: cocoon.HypervisorFirecracker})
	s.importSnapshot(testimage.SnapshotOptions{Name: "deaf", Hypervisor: cocoon.HypervisorFirecracker, Guest: guest.Spec{IgnorePowerButton: true}})
	for _, tc := range []struct {
		snapshot, logLine string
	}{
		{"fc", "guest powered off (Ctrl-Alt-Del)"},
		{"deaf", "power button: guest ignores it"},
	} {
		vm := s.clone(tc.snapshot, "vm-"+tc.snapshot)
		s.ok("vm", "stop", "--timeout", "1", vm.ID)
		if testproc.Running(vm.PID) {
			t.Fatalf("%s: firecracker %d outlived vm stop", tc.snapshot, vm.PID)
		}
		if log := readLog(t, s, vm.ID); !strings.Contains(log, tc.logLine) {
			t.Fatalf("%s: firecracker log lacks %q:\n%s", tc.snapshot, tc.logLine, log)
		}
		for _, name := range []string{"api.sock", "fc.pid", "console.sock", "vsock.uds"} {
			if _, err := os.Stat(filepath.Join(filepath.Dir(vm.SocketPath), name)); err == nil {
				t.Fatalf("%s: %s left after vm stop", tc.snapshot, name)
			}
		}
	}
}

// TestFirecrackerSnapshotRoundTrip: a Firecracker VM snapshotted and cloned again keeps its guest
// (the same machine-id) and records cpu and memory in cocoon.json; a cold start boots it again.
func TestFirecrackerSnapshotRoundTrip(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "fc", Hypervisor: cocoon.HypervisorFirecracker, CPU: 1, Memory: 768 << 20})
	s.clone("fc", "src")
	id := s.ok("vm", "exec", "src", "--", "cat", "/etc/machine-id")
	s.ok("snapshot", "save", "--name", "again", "src")
	copyVM := s.clone("again", "copy")
	if copyVM.Hypervisor != cocoon.HypervisorFirecracker || copyVM.Config.Memory != 768<<20 {
		t.Fatalf("clone of the saved snapshot: %+v", copyVM)
	}
	s.ok("vm", "stop", "src")
	s.ok("vm", "start", "src")
	if got := s.ok("vm", "exec", "src", "--", "cat", "/etc/machine-id"); got != id {
		t.Fatalf("machine-id after a cold start %q, want %q", got, id)
	}
}

func dialConsole(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

package cocoonsim_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

func TestCloneValidation(t *testing.T) {
	s := newSimAt(t, "0.3.8")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base", CPU: 1, Memory: 1 << 30, Storage: 20 << 30})
	s.importSnapshot(testimage.SnapshotOptions{Name: "fc", Image: "fc-image", Hypervisor: cocoon.HypervisorFirecracker})
	host := runtime.NumCPU()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"base"}, "vm name cannot be empty"},
		{[]string{"--name", "-bad", "base"}, `vm name "-bad" is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ (max 63 chars)`},
		{[]string{"--name", strings.Repeat("a", 64), "base"}, fmt.Sprintf(`vm name %q is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ (max 63 chars)`, strings.Repeat("a", 64))},
		{[]string{"--name", "c", "--memory", "512M", "base"}, "--memory 536.9MB below snapshot minimum 1.074GB"},
		{[]string{"--name", "c", "--storage", "10G", "base"}, "--storage 10.74GB below snapshot minimum 21.47GB"},
		{[]string{"--name", "c", "--memory", "1x", "base"}, `invalid --memory "1x": invalid suffix: 'x'`},
		{[]string{"--name", "c", "--cpu", fmt.Sprint(host + 1), "base"}, fmt.Sprintf("clone VM: requested %d vCPUs exceeds host cores (%d)", host+1, host)},
		{[]string{"--name", "c", "--nics", "1", "base"}, "configure network: network provider not configured: no conflist found in " + s.ci},
		{[]string{"--name", "c", "--cpu", "2", "fc"}, "--cpu 2 not supported: Firecracker cannot change CPU after snapshot/load (snapshot has 1)"},
		{[]string{"--name", "c", "--memory", "1G", "fc"}, "--memory not supported: Firecracker cannot change memory after snapshot/load"},
		{[]string{"--name", "c", "--nics", "2", "fc"}, "--nics 2 not supported: Firecracker cannot change NIC count after snapshot/load (snapshot has 0)"},
	} {
		s.fails(tc.want, append([]string{"vm", "clone"}, tc.args...)...)
	}
	// A clone failing before launch leaves no record.
	if got := s.ok("vm", "list", "-o", "json"); got != "No VMs found.\n" { // v0.3.8's empty list
		t.Fatalf("failed clones left records: %s", got)
	}
	s.clone("base", "taken")
	r := s.cocoon("vm", "clone", "--name", "taken", "base")
	if r.code != 1 || !strings.HasPrefix(r.errorLine(), `Error: clone VM: reserve VM record: vm name "taken" already exists (id: `) {
		t.Fatalf("duplicate name: %q", r.errorLine())
	}
}

// TestCloneOfV05HasTheSnapshotsSize: from v0.5 vm clone has no --cpu, --memory or --storage
// (cobra refuses them as unknown) and a clone gets its snapshot's size.
func TestCloneOfV05HasTheSnapshotsSize(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	snap := s.importSnapshot(testimage.SnapshotOptions{Name: "base", CPU: 2, Memory: 1 << 30, Storage: 20 << 30})
	s.fails(`invalid --restore-mode "lazy": must be copy, ondemand or mmap`, "vm", "clone", "--name", "c", "--restore-mode", "lazy", "base")
	for _, flag := range []string{"--cpu=2", "--memory=4G", "--storage=40G", "--on-demand"} {
		s.fails("unknown flag: "+strings.SplitN(flag, "=", 2)[0], "vm", "clone", "--name", "c", flag, "base")
	}
	if help := s.ok("vm", "clone", "--help"); strings.Contains(help, "--cpu") || strings.Contains(help, "--memory") {
		t.Fatalf("v0.5.1 clone help lists resize flags:\n%s", help)
	}
	vm := s.clone("base", "sized")
	if vm.Config.CPU != snap.CPU || vm.Config.Memory != snap.Memory || vm.Config.Storage != snap.Storage {
		t.Fatalf("clone size %d/%d/%d, want the snapshot's %d/%d/%d",
			vm.Config.CPU, vm.Config.Memory, vm.Config.Storage, snap.CPU, snap.Memory, snap.Storage)
	}
}

func TestCloneRunsGuestWithPTYConsole(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	out := decode[cocoon.VM](t, s.ok("vm", "clone", "--name", "web-1", "-o", "json", "base"))
	if out.State != cocoon.VMStateRunning || out.PID != 0 || out.Hypervisor != cocoon.HypervisorCloudHypervisor || out.Config.Name != "web-1" || out.StartedAt == nil {
		t.Fatalf("clone -o json: %+v", out)
	}
	vm := s.inspect("web-1")
	if vm.ID != out.ID || vm.State != cocoon.VMStateRunning || !testproc.Running(vm.PID) {
		t.Fatalf("inspect after clone: %+v", vm)
	}
	runDir := filepath.Join(s.run, "cloudhypervisor", vm.ID)
	if vm.SocketPath != filepath.Join(runDir, "api.sock") {
		t.Fatalf("socket_path %q", vm.SocketPath)
	}
	pidFile, _ := os.ReadFile(filepath.Join(runDir, "ch.pid"))
	if strings.TrimSpace(string(pidFile)) != fmt.Sprint(vm.PID) {
		t.Fatalf("ch.pid %q, inspect pid %d", pidFile, vm.PID)
	}
	info := vmInfo(t, vm.SocketPath)
	console := info["config"].(map[string]any)["console"].(map[string]any)
	if console["mode"] != "Pty" || !strings.HasPrefix(console["file"].(string), "/dev/pts/") {
		t.Fatalf("vm.info console: %v", console)
	}
	pty, err := os.OpenFile(console["file"].(string), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pty.Close() //nolint:errcheck
	readUntil(t, pty, "cocoon-sim guest web-1 ready")

	// Stopping a direct-boot VM is immediate; stopping it again is fine too.
	stopped := decode[cocoon.BatchResult](t, s.ok("vm", "stop", "-o", "json", "web-1"))
	if len(stopped.Succeeded) != 1 || stopped.Succeeded[0] != vm.ID {
		t.Fatalf("stop -o json: %+v", stopped)
	}
	eventually(t, "hypervisor exit", func() bool { return !testproc.Running(vm.PID) })
	s.ok("vm", "stop", "web-1")
	if got := s.inspect("web-1"); got.State != cocoon.VMStateStopped || got.PID != 0 || got.SocketPath != "" || got.StoppedAt == nil {
		t.Fatalf("after stop: %+v", got)
	}

	// A cold start boots from the record with a fresh banner.
	s.ok("vm", "start", "web-1")
	restarted := s.inspect("web-1")
	// A live hypervisor now, where the old one was seen gone: a new process, whatever its PID.
	if restarted.State != cocoon.VMStateRunning || !testproc.Running(restarted.PID) {
		t.Fatalf("after start: %+v", restarted)
	}
	s.ok("vm", "start", "web-1") // already running counts as success
	file := vmInfo(t, restarted.SocketPath)["config"].(map[string]any)["console"].(map[string]any)["file"].(string)
	pty2, err := os.OpenFile(file, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pty2.Close() //nolint:errcheck
	banner := readUntil(t, pty2, "cocoon-sim guest web-1 ready")
	if !strings.Contains(banner, "Linux version") {
		t.Fatalf("cold boot banner: %q", banner)
	}
	rm := decode[cocoon.BatchResult](t, s.ok("vm", "rm", "--force", "-o", "json", "web-1"))
	if len(rm.Succeeded) != 1 {
		t.Fatalf("rm -o json: %+v", rm)
	}
	if testproc.Running(restarted.PID) {
		t.Fatal("rm --force left the hypervisor running")
	}
	for _, dir := range []string{runDir, filepath.Join(s.log, "cloudhypervisor", vm.ID)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s not removed: %v", dir, err)
		}
	}
}

func TestClonePrintsPostCloneHintsWithoutJSON(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	out := s.ok("vm", "clone", "--name", "hinted", "base")
	want := "\nRun inside the guest to finish setup:\n\n  # Release memory for balloon\n  echo 3 > /proc/sys/vm/drop_caches\n\n" +
		"  # Clean old network configs from snapshot and write new ones (MAC-based)\n  rm -f /etc/systemd/network/10-*.network\n\n" +
		"  # Set hostname\n  hostnamectl set-hostname hinted\n\n"
	if out != want {
		t.Fatalf("hints:\n%q\nwant\n%q", out, want)
	}
}

func TestCloudImageCloneServesSerialSocket(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "uefi", ImageType: cocoon.ImageTypeCloudImg, Image: "https://example.invalid/cloud.qcow2"})
	vm := s.clone("uefi", "win-1")
	info := vmInfo(t, vm.SocketPath)["config"].(map[string]any)
	serial := info["serial"].(map[string]any)
	sock := filepath.Join(s.run, "cloudhypervisor", vm.ID, "console.sock")
	if serial["mode"] != "Socket" || serial["socket"] != sock {
		t.Fatalf("vm.info serial: %v", serial)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, conn.(*net.UnixConn), "cocoon-sim guest win-1 ready")
	_ = conn.Close()

	// UEFI stop: the guest answers the power button and powers off.
	start := time.Now()
	s.ok("vm", "stop", "win-1")
	if !strings.Contains(stripANSI(readLog(t, s, vm.ID)), "ACPI power button") {
		t.Fatalf("guest did not power off through ACPI: %s", readLog(t, s, vm.ID))
	}
	t.Logf("graceful UEFI stop took %s", time.Since(start))
	if got := s.inspect("win-1"); got.State != cocoon.VMStateStopped || testproc.Running(vm.PID) {
		t.Fatalf("after stop: %+v", got)
	}
}

// readLog reads a VM's hypervisor log: cloud-hypervisor's or Firecracker's.
func readLog(t *testing.T, s *sim, vmID string) string {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(s.log, "*", vmID, "*.log"))
	if len(logs) != 1 {
		t.Fatalf("hypervisor logs of %s: %v", vmID, logs)
	}
	data, err := os.ReadFile(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestOnDemandCloneCrashesWhenSnapshotDeleted: a clone whose memory stays backed by the snapshot
// (v0.3.8 --on-demand; v0.5 --restore-mode ondemand or mmap, mmap being the default) dies with
// the snapshot's files; a copied clone does not.
func TestOnDemandCloneCrashesWhenSnapshotDeleted(t *testing.T) {
	for _, tc := range []struct {
		version      string
		lazy, copied [][]string
	}{
		{"0.3.8", [][]string{{"--on-demand"}}, [][]string{nil}},
		{"0.5.1", [][]string{{"--restore-mode", "ondemand"}, {"--restore-mode", "mmap"}, nil}, [][]string{{"--restore-mode", "copy"}}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			s := newSimAt(t, tc.version)
			s.importSnapshot(testimage.SnapshotOptions{Name: "lazy"})
			var lazy, copied []cocoon.VM
			for i, flags := range tc.lazy {
				lazy = append(lazy, s.clone("lazy", fmt.Sprintf("lazy-%d", i), flags...))
			}
			for i, flags := range tc.copied {
				copied = append(copied, s.clone("lazy", fmt.Sprintf("copied-%d", i), flags...))
			}
			s.ok("snapshot", "rm", "lazy")
			for _, vm := range lazy {
				eventually(t, vm.Config.Name+" to crash", func() bool { return reaped(vm.PID) })
				if got := s.inspect(vm.Config.Name); got.State != cocoon.VMStateStale {
					t.Fatalf("%s after snapshot removal: %s", vm.Config.Name, got.State)
				}
			}
			for _, vm := range copied {
				if !testproc.Running(vm.PID) {
					t.Fatalf("%s, a copied clone, must not depend on its snapshot", vm.Config.Name)
				}
			}
		})
	}
}

func TestGuestBehaviours(t *testing.T) {
	s := newSimAt(t, "0.3.8") // whose vm list -o json shows the record's raw state
	s.importSnapshot(testimage.SnapshotOptions{Name: "off", Guest: guest.Spec{PoweroffAfter: guest.Duration(300 * time.Millisecond)}})
	s.importSnapshot(testimage.SnapshotOptions{Name: "boom", Image: "boom", Guest: guest.Spec{CrashAfter: guest.Duration(300 * time.Millisecond)}})
	s.importSnapshot(testimage.SnapshotOptions{Name: "stubborn", Image: "stubborn", ImageType: cocoon.ImageTypeCloudImg, Guest: guest.Spec{IgnorePowerButton: true}})

	off := s.clone("off", "off-1")
	boom := s.clone("boom", "boom-1")
	eventually(t, "self power-off", func() bool { return reaped(off.PID) })
	eventually(t, "crash", func() bool { return reaped(boom.PID) })
	for _, name := range []string{"off-1", "boom-1"} {
		// Nothing updates the record when the hypervisor exits on its own: list shows the raw
		// "running", inspect reconciles.
		listed := decode[[]cocoon.VM](t, s.ok("vm", "list", "-o", "json"))
		for _, vm := range listed {
			if vm.Config.Name == name && vm.State != cocoon.VMStateRunning {
				t.Errorf("vm list -o json shows %s for %s, want the raw running", vm.State, name)
			}
		}
		if got := s.inspect(name); got.State != cocoon.VMStateStale {
			t.Errorf("inspect %s: %s, want stopped (stale)", name, got.State)
		}
	}
	if !strings.Contains(readLog(t, s, off.ID), "guest powered off") {
		t.Errorf("poweroff not logged: %s", readLog(t, s, off.ID))
	}

	// A guest that ignores the power button makes a UEFI stop time out and escalate.
	stubborn := s.clone("stubborn", "stubborn-1")
	r := s.cocoon("vm", "stop", "--timeout", "1", "stubborn-1")
	if r.code != 0 || !strings.Contains(stripANSI(r.stderr), "did not shut down within 1s, escalating") {
		t.Fatalf("escalating stop: exit %d, %s", r.code, stripANSI(r.stderr))
	}
	if testproc.Running(stubborn.PID) || s.inspect("stubborn-1").State != cocoon.VMStateStopped {
		t.Fatal("escalated stop did not stop the VM")
	}
}

func TestCrashShowsStaleAndRemoveNeedsForce(t *testing.T) {
	s := newSimAt(t, "0.3.8") // whose vm list -o json shows the record's raw state
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "victim")
	r := s.cocoon("vm", "rm", "-o", "json", "victim")
	if r.code != 1 || r.stdout != "" || r.errorLine() != "Error: rm: item "+vm.ID+": stop before delete: running (force required)" {
		t.Fatalf("rm of running VM: exit %d, stdout %q, %q", r.code, r.stdout, r.errorLine())
	}
	if err := syscall.Kill(vm.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "killed guest to disappear", func() bool { return reaped(vm.PID) })
	listed := decode[[]cocoon.VM](t, s.ok("vm", "list", "-o", "json"))
	if len(listed) != 1 || listed[0].State != cocoon.VMStateRunning || listed[0].PID != vm.PID {
		t.Fatalf("vm list -o json after crash: %+v", listed)
	}
	if got := s.inspect("victim"); got.State != cocoon.VMStateStale || got.PID != vm.PID {
		t.Fatalf("inspect after crash: %+v", got)
	}
	if table := s.ok("vm", "list"); !strings.Contains(table, "stopped (stale)") {
		t.Fatalf("table after crash:\n%s", table)
	}
	// A dead hypervisor is not "running" for rm: no --force needed.
	s.ok("vm", "rm", "victim")
}

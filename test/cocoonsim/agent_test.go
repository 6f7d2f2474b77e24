package cocoonsim_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// guestMachineID reads a VM's /etc/machine-id from the host side of the guest's files, which
// works whether or not the guest has an agent.
func (s *sim) guestMachineID(vm cocoon.VM) string {
	s.t.Helper()
	data, err := os.ReadFile(filepath.Join(s.run, "cloudhypervisor", vm.ID, "guest", "etc", "machine-id"))
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// TestCloneMachineID: clones of a snapshot start with the snapshot's machine-id. v0.3.8 leaves
// it so; v0.5's clone reseeds its guest with a fresh one, and vm reseed --machine-id makes another.
func TestCloneMachineID(t *testing.T) {
	snapshotID := testimage.SnapshotMachineID("base")

	old := newSimAt(t, "0.3.8")
	old.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	for _, name := range []string{"a", "b"} {
		if got := old.guestMachineID(old.clone("base", name)); got != snapshotID {
			t.Fatalf("v0.3.8 clone %s: machine-id %s, want the snapshot's %s", name, got, snapshotID)
		}
	}

	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	a, b := s.clone("base", "a"), s.clone("base", "b")
	idA, idB := s.guestMachineID(a), s.guestMachineID(b)
	if idA == snapshotID || idB == snapshotID || idA == idB || len(idA) != 32 {
		t.Fatalf("v0.5.1 clones: machine-ids %s and %s, snapshot's %s: want two new ones", idA, idB, snapshotID)
	}
	if got := s.inGuest("a", "cat", "/etc/machine-id"); got != idA+"\n" {
		t.Fatalf("the guest reads machine-id %q, its file has %s", got, idA)
	}
	s.ok("vm", "reseed", "a")
	if got := s.guestMachineID(a); got != idA {
		t.Fatalf("vm reseed without --machine-id changed it: %s to %s", idA, got)
	}
	s.ok("vm", "reseed", "--machine-id", "a")
	if got := s.inGuest("a", "cat", "/etc/machine-id"); got == idA+"\n" || len(strings.TrimSpace(got)) != 32 {
		t.Fatalf("after vm reseed --machine-id the guest reads %q (was %s)", got, idA)
	}
	s.fails("reseed: vm nosuch: VM not found", "vm", "reseed", "nosuch")
	s.ok("vm", "stop", "b")
	s.fails("reseed: vm not running", "vm", "reseed", "b")
}

// TestGuestWithoutAgent: a v0.5 VM whose image lacks cocoon-agent has a vsock device that nothing
// answers on. Its clone still succeeds (the reseed is best effort) and keeps the snapshot's
// machine-id; exec and reseed fail as cocoon's do.
func TestGuestWithoutAgent(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "bare", Guest: guest.Spec{NoAgent: true}})
	vm := s.clone("bare", "bare")
	if got := s.guestMachineID(vm); got != testimage.SnapshotMachineID("bare") {
		t.Fatalf("machine-id %s, want the snapshot's", got)
	}
	if !strings.Contains(s.ok("vm", "inspect", "bare"), `"vsock_socket"`) {
		t.Fatal("the VM has no vsock device")
	}
	s.fails("exec: dial agent: read CONNECT reply: EOF (cocoon-agent may still be starting; retry shortly)", "vm", "exec", "bare", "--", "true")
	s.fails("reseed: dial agent: read CONNECT reply: EOF", "vm", "reseed", "bare")
}

// TestV05ListsReconcile: v0.5's vm list -o json shows a running record over a dead hypervisor as
// "stopped (stale)" (v0.3.8 shows the record's "running"), and its vm status without --event or
// --watch prints the list once and exits.
func TestV05ListsReconcile(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    cocoon.VMState
	}{
		{"0.3.8", cocoon.VMStateRunning},
		{"0.5.1", cocoon.VMStateStale},
	} {
		t.Run(tc.version, func(t *testing.T) {
			s := newSimAt(t, tc.version)
			s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
			vm := s.clone("base", "dies")
			if err := syscall.Kill(vm.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			eventually(t, "killed hypervisor to be reaped", func() bool { return reaped(vm.PID) })
			list := decode[[]cocoon.VM](t, s.ok("vm", "list", "-o", "json"))
			if len(list) != 1 || list[0].State != tc.want {
				t.Fatalf("vm list -o json: %+v, want one VM %q", list, tc.want)
			}
		})
	}
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "one")
	list := decode[[]cocoon.VM](t, s.ok("vm", "status", "--format", "json", "one"))
	if len(list) != 1 || list[0].Config.Name != "one" || list[0].State != cocoon.VMStateRunning {
		t.Fatalf("one-shot vm status: %+v", list)
	}
	s.fails("--event and --watch are mutually exclusive", "vm", "status", "--event", "--watch")
}

// TestNoReapKeepsZombies: on a host whose init does not reap, a killed hypervisor stays a zombie
// and cocoon, whose liveness check is kill(pid, 0), still calls its VM running in inspect and in
// both releases' lists. vm stop then succeeds and the zombie goes with the PID file.
func TestNoReapKeepsZombies(t *testing.T) {
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			s := newSimAt(t, version)
			s.env = append(s.env, cocoonsim.NoReapEnv+"=1")
			s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
			vm := s.clone("base", "dies")
			if err := syscall.Kill(vm.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			eventually(t, "killed hypervisor to become a zombie", func() bool { return testproc.State(vm.PID) == "Z" })
			if got := s.inspect("dies").State; got != cocoon.VMStateRunning {
				t.Fatalf("vm inspect of a zombie hypervisor: %q, want running (kill(pid, 0) succeeds)", got)
			}
			if list := s.listVMs(); len(list) != 1 || list[0].State != cocoon.VMStateRunning {
				t.Fatalf("vm list of a zombie hypervisor: %+v, want one running VM", list)
			}
			s.ok("vm", "stop", "dies")
			if got := s.inspect("dies").State; got != cocoon.VMStateStopped {
				t.Fatalf("after vm stop: %q, want stopped", got)
			}
			eventually(t, "the zombie to be reaped once its PID file is gone", func() bool { return !testproc.Running(vm.PID) })
		})
	}
}

// TestKillGuestsReleasesZombies: the harness's cleanup also ends a hypervisor held as a zombie.
func TestKillGuestsReleasesZombies(t *testing.T) {
	s := newSim(t)
	s.env = append(s.env, cocoonsim.NoReapEnv+"=1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "held")
	if err := syscall.Kill(vm.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "killed hypervisor to become a zombie", func() bool { return testproc.State(vm.PID) == "Z" })
	if err := cocoonsim.KillGuests(s.run); err != nil {
		t.Fatal(err)
	}
	if testproc.Running(vm.PID) {
		t.Fatalf("hypervisor %d is still there after KillGuests", vm.PID)
	}
}

// TestGuestPoweroff: poweroff run in a guest shuts it down as its init would: the command
// answers 0, the hypervisor exits, cocoon calls the VM stale until vm stop records it stopped.
func TestGuestPoweroff(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "down")
	if r := s.cocoon("vm", "exec", "down", "--", "poweroff"); r.code != 0 {
		t.Fatalf("vm exec poweroff: exit %d, stderr %s", r.code, r.stderr)
	}
	eventually(t, "the hypervisor to exit after poweroff", func() bool { return reaped(vm.PID) })
	if got := s.inspect("down").State; got != cocoon.VMStateStale {
		t.Fatalf("after the guest powered off: %q, want %q", got, cocoon.VMStateStale)
	}
	s.ok("vm", "stop", "down")
	if got := s.inspect("down").State; got != cocoon.VMStateStopped {
		t.Fatalf("after vm stop: %q, want stopped", got)
	}
}

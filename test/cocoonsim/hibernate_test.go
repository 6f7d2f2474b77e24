package cocoonsim_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

var hibernatedRE = regexp.MustCompile(`VM hibernated; snapshot ([A-Z2-7]{26}) \(resume: cocoon vm restore (\S+) (\S+)\)`)

// guestIdentity is what a hibernated guest must wake with: its /dev/shm, hostname and machine-id.
func (s *sim) guestIdentity(vm string) string {
	s.t.Helper()
	return s.inGuest(vm, "sh", "-c", describeShm+"\nhostname\ncat /etc/machine-id")
}

// TestHibernateAndRestore: v0.5's vm hibernate snapshots a running VM into a snapshot it owns and
// ends its hypervisor; the VM is then stopped. vm restore brings the same VM (ID, name, NICs)
// back in a new hypervisor with the guest as it was: /dev/shm, hostname and machine-id. A running
// VM restores too, and the snapshot stays until snapshot rm.
func TestHibernateAndRestore(t *testing.T) {
	for _, hv := range []string{cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker} {
		t.Run(hv, func(t *testing.T) {
			s := newSimAt(t, "0.5.1")
			s.importSnapshot(testimage.SnapshotOptions{Name: "base", Hypervisor: hv})
			before := s.clone("base", "box")
			s.inGuest("box", "sh", "-c", fillShm)
			want := s.guestIdentity("box")

			r := s.cocoon("vm", "hibernate", "--name", "nap", "--description", "asleep", "box")
			if r.code != 0 || r.stdout != "" {
				t.Fatalf("hibernate: exit %d, stdout %q, %s", r.code, r.stdout, stripANSI(r.stderr))
			}
			m := hibernatedRE.FindStringSubmatch(stripANSI(r.stderr))
			if m == nil || m[2] != "box" || m[3] != "nap" {
				t.Fatalf("hibernate log: %s", stripANSI(r.stderr))
			}
			snap := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "nap"))
			if snap.ID != m[1] || snap.Description != "asleep" || snap.Hypervisor != hv {
				t.Fatalf("hibernation snapshot: %+v", snap)
			}
			asleep := s.inspect("box")
			if _, ok := asleep.SnapshotIDs[snap.ID]; !ok || asleep.State != cocoon.VMStateStopped || asleep.PID != 0 || asleep.SocketPath != "" || asleep.StoppedAt == nil {
				t.Fatalf("hibernated VM: %+v", asleep)
			}
			eventually(t, "the hibernated VM's hypervisor to be gone", func() bool { return !testproc.Running(before.PID) })
			if vms := s.listVMs(); len(vms) != 1 || vms[0].State != cocoon.VMStateStopped {
				t.Fatalf("vm list after hibernate: %+v", vms)
			}

			r = s.cocoon("vm", "restore", "box", "nap")
			if r.code != 0 || r.stdout != "" || !strings.Contains(stripANSI(r.stderr), "VM "+before.ID+" restored (state: running)") {
				t.Fatalf("restore: exit %d, stdout %q, %s", r.code, r.stdout, stripANSI(r.stderr))
			}
			after := s.inspect("box")
			if after.ID != before.ID || after.State != cocoon.VMStateRunning || after.PID == 0 || after.PID == before.PID || !testproc.Running(after.PID) {
				t.Fatalf("restored VM: %+v (before: pid %d)", after, before.PID)
			}
			if len(after.NetworkConfigs) != len(before.NetworkConfigs) {
				t.Fatalf("restored NICs: %+v, before %+v", after.NetworkConfigs, before.NetworkConfigs)
			}
			for i, nc := range after.NetworkConfigs {
				if !sameNIC(nc, before.NetworkConfigs[i]) {
					t.Fatalf("restored NIC %d: %+v, before %+v", i, nc, before.NetworkConfigs[i])
				}
			}
			if got := s.guestIdentity("box"); got != want {
				t.Fatalf("guest after hibernate and restore:\n%s\nwant:\n%s", got, want)
			}

			// A running VM restores as well, in a new hypervisor, and -o json prints it.
			s.inGuest("box", "sh", "-c", "echo later > /dev/shm/later")
			restored := decode[cocoon.VM](t, s.ok("vm", "restore", "-o", "json", "--restore-mode", "copy", "box", snap.ID))
			if restored.State != cocoon.VMStateRunning || restored.PID == after.PID || restored.PID == 0 {
				t.Fatalf("restore of a running VM: %+v", restored)
			}
			eventually(t, "the replaced hypervisor to be gone", func() bool { return !testproc.Running(after.PID) })
			if got := s.guestIdentity("box"); got != want {
				t.Fatalf("guest after restoring a running VM:\n%s\nwant:\n%s", got, want)
			}
			if got := s.vmExec("", "box", "--", "test", "-e", "/dev/shm/later"); got.code != 1 {
				t.Fatalf("a file written after the hibernation survived the restore: exit %d", got.code)
			}
			s.ok("vm", "stop", "box")
			s.ok("snapshot", "inspect", "nap")
		})
	}
}

// TestHibernateAndRestoreRefusals: cocoon's refusals, in its order and words; a refused hibernate
// leaves the VM running and records no snapshot.
func TestHibernateAndRestoreRefusals(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	box := s.clone("base", "box")
	other := s.clone("base", "other")
	s.ok("snapshot", "save", "--name", "others", "other")

	s.fails("find VM nope: vm nope: VM not found", "vm", "hibernate", "nope")
	s.fails(`snapshot name "others" already exists`, "vm", "hibernate", "--name", "others", "box")
	s.fails("find VM nope: vm nope: VM not found", "vm", "restore", "nope", "others")
	s.fails("inspect snapshot: snapshot not found", "vm", "restore", "box", "missing")
	s.fails("snapshot others does not belong to VM box", "vm", "restore", "box", "others")
	s.fails("snapshot base does not belong to VM box", "vm", "restore", "box", "base")
	s.fails("--force only applies with --from-dir", "vm", "restore", "--force", "box", "others")
	s.fails("snapshot is required (or use --from-dir)", "vm", "restore", "box")
	s.fails("--from-dir and positional SNAPSHOT are mutually exclusive", "vm", "restore", "--from-dir", "/nowhere", "box", "others")

	// A hot-attached disk is refused inside the pause step; the VM runs on, unpaused.
	vol := filepath.Join(t.TempDir(), "vol.raw")
	if err := os.WriteFile(vol, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	s.ok("vm", "disk", "attach", "box", "--path", vol, "--name", "vol")
	s.fails(`hibernate VM `+box.ID+`: pause: hot-attached disk "vol": detach before snapshot or hibernate`, "vm", "hibernate", "--name", "nap", "box")
	s.ok("vm", "disk", "detach", "box", "--name", "vol")
	if vm := s.inspect("box"); vm.State != cocoon.VMStateRunning || vm.PID != box.PID || len(vm.SnapshotIDs) != 0 || vmInfo(t, vm.SocketPath)["state"] != "Running" {
		t.Fatalf("VM after a refused hibernate: %+v", vm)
	}
	s.fails("inspect: snapshot not found", "snapshot", "inspect", "nap")

	s.ok("vm", "stop", "box")
	s.fails("hibernate VM "+box.ID+": VM not running", "vm", "hibernate", "box")
	s.ok("vm", "rm", "--force", "other")
	_ = other
}

// TestHibernatePersistFailureResumesTheVM: a snapshot store that runs out of space while the
// hibernation is persisted (a tmpfs too small for the guest's RAM) fails the command with the
// store's error; the VM is resumed, keeps running in the same hypervisor and owns no snapshot.
func TestHibernatePersistFailureResumesTheVM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	// Its memory is copied: the store's tmpfs below hides the base snapshot's files.
	box := s.clone("base", "box", "--restore-mode", "copy")
	s.inGuest("box", "sh", "-c", fillShm)
	store := filepath.Join(s.root, "snapshot", "localfile")
	if err := unix.Mount("tmpfs", store, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(store, unix.MNT_DETACH) })

	r := s.cocoon("vm", "hibernate", "--name", "nap", "box")
	if line := r.errorLine(); r.code != 1 || !strings.HasPrefix(line, "Error: hibernate VM "+box.ID+": persist snapshot: ") || !strings.HasSuffix(line, ": no space left on device") {
		t.Fatalf("hibernate into a full store: exit %d, error line %q", r.code, line)
	}
	vm := s.inspect("box")
	if vm.State != cocoon.VMStateRunning || vm.PID != box.PID || len(vm.SnapshotIDs) != 0 || vmInfo(t, vm.SocketPath)["state"] != "Running" {
		t.Fatalf("VM after a failed persist: %+v", vm)
	}
	if got := decode[[]cocoon.Snapshot](t, s.ok("snapshot", "list", "-o", "json")); len(got) != 1 || got[0].Name != "base" {
		t.Fatalf("snapshots after a failed persist: %+v", got)
	}
	s.inGuest("box", "cat", "/dev/shm/dir/first")
}

// TestHibernateIsV05: v0.3.8 has no vm hibernate (cobra prints vm's help and exits 0, as for
// every unknown vm subcommand), and its vm restore is not simulated.
func TestHibernateIsV05(t *testing.T) {
	s := newSimAt(t, "0.3.8")
	r := s.cocoon("vm", "hibernate", "box")
	if r.code != 0 || !strings.Contains(r.stdout, "Available Commands:") || strings.Contains(r.stdout, "hibernate") {
		t.Fatalf("0.3.8 vm hibernate: exit %d, stdout %q, stderr %q", r.code, r.stdout, stripANSI(r.stderr))
	}
	s.fails("unknown flag: --name", "vm", "hibernate", "--name", "x", "box")
	s.fails("unknown flag: --restore-mode", "vm", "restore", "--restore-mode", "copy", "box", "snap")
	s.fails(`cocoon-sim: "vm restore" is not simulated`, "vm", "restore", "box", "snap")

	help := newSimAt(t, "0.5.1").ok("vm", "--help")
	if !strings.Contains(help, "hibernate") {
		t.Fatalf("0.5.1 vm --help lists no hibernate:\n%s", help)
	}
}

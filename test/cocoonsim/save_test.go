package cocoonsim_test

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

var savedRE = regexp.MustCompile(`snapshot saved: ([A-Z2-7]{26}) func=cmd\.snapshot\.save`)

func TestSnapshotSaveAndCloneFromIt(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base", Memory: 1 << 30, Guest: guest.Spec{PoweroffAfter: guest.Duration(time.Hour)}})
	src := s.clone("base", "src")
	if got := s.ok("snapshot", "list", "--vm", "src"); got != "No snapshots found for VM.\n" {
		t.Fatalf("list --vm before save: %q", got)
	}

	r := s.cocoon("snapshot", "save", "--name", "golden", "--description", "from src", "src")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("save: exit %d, stdout %q, %s", r.code, r.stdout, stripANSI(r.stderr))
	}
	m := savedRE.FindStringSubmatch(stripANSI(r.stderr))
	if m == nil {
		t.Fatalf("no ID in the save log: %s", stripANSI(r.stderr))
	}
	snap := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "golden"))
	if snap.ID != m[1] || snap.Memory != 1<<30 || snap.Description != "from src" || snap.Hypervisor != cocoon.HypervisorCloudHypervisor {
		t.Fatalf("saved snapshot: %+v", snap)
	}
	if _, ok := s.inspect("src").SnapshotIDs[snap.ID]; !ok {
		t.Fatal("the VM does not record its snapshot")
	}
	listed := decode[[]cocoon.Snapshot](t, s.ok("snapshot", "list", "--vm", "src", "-o", "json"))
	if len(listed) != 1 || listed[0].ID != snap.ID {
		t.Fatalf("list --vm: %+v", listed)
	}
	s.fails(`snapshot name "golden" already exists`, "snapshot", "save", "--name", "golden", "src")
	if !testproc.Running(src.PID) || vmInfo(t, src.SocketPath)["state"] != "Running" {
		t.Fatal("the source VM must be running again after the snapshot")
	}

	// The saved snapshot clones like an imported one and keeps the guest's behaviour file.
	clone := s.clone("golden", "from-golden")
	if !testproc.Running(clone.PID) || clone.Config.Memory != 1<<30 {
		t.Fatalf("clone of saved snapshot: %+v", clone)
	}
	spec, err := guest.ReadSpec(filepath.Join(s.run, "cloudhypervisor", clone.ID))
	if err != nil || time.Duration(spec.PoweroffAfter) != time.Hour {
		t.Fatalf("guest behaviour did not travel through save: %+v, %v", spec, err)
	}

	s.ok("vm", "stop", "src")
	s.fails("snapshot VM src: snapshot VM "+src.ID+": VM not running", "snapshot", "save", "--name", "late", "src")
}

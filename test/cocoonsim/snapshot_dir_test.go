package cocoonsim_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/dirtree"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestSnapshotDirectories: v0.5's snapshot export --to-dir writes a snapshot's files and its
// snapshot.json into a directory, and vm clone --from-dir runs a VM of it without importing it:
// the guest has the saved RAM, the directory is only read (every file as it was, also after the
// snapshot and the clones are gone), and it can be cloned again and again.
func TestSnapshotDirectories(t *testing.T) {
	for _, hypervisor := range []string{cocoon.HypervisorCloudHypervisor, cocoon.HypervisorFirecracker} {
		t.Run(hypervisor, func(t *testing.T) {
			s := newSimAt(t, "0.5.1")
			s.importSnapshot(testimage.SnapshotOptions{Name: "base", Hypervisor: hypervisor})
			s.clone("base", "src")
			s.inGuest("src", "sh", "-c", fillShm)
			want := s.inGuest("src", "sh", "-c", describeShm)
			s.ok("snapshot", "save", "--name", "golden", "src")

			dir := filepath.Join(t.TempDir(), "golden")
			s.ok("snapshot", "export", "golden", "--to-dir", dir)
			files := dirtree.Describe(t, dir)
			if !strings.Contains(files, "snapshot.json ") {
				t.Fatalf("the exported directory has no snapshot.json:\n%s", files)
			}
			data, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
			if err != nil {
				t.Fatal(err)
			}
			envelope := decode[cocoon.SnapshotExport](t, string(data))
			if envelope.Version != cocoon.SnapshotExportVersion || envelope.Config.Name != "golden" || envelope.Config.Hypervisor != hypervisor {
				t.Fatalf("snapshot.json: %+v", envelope)
			}

			s.ok("vm", "clone", "--name", "first", "-o", "json", "--from-dir", dir)
			if got := s.inGuest("first", "sh", "-c", describeShm); got != want {
				t.Fatalf("the clone of the directory has in /dev/shm:\n%s\nwant what the source had when saved:\n%s", got, want)
			}
			s.inGuest("first", "sh", "-c", "echo mine > /dev/shm/dir/first")
			s.ok("snapshot", "rm", "golden")
			s.ok("vm", "clone", "--name", "second", "-o", "json", "--from-dir", dir)
			if got := s.inGuest("second", "sh", "-c", describeShm); got != want {
				t.Fatalf("a second clone, after the first changed its RAM and the snapshot went:\n%s\nwant:\n%s", got, want)
			}
			s.ok("vm", "rm", "--force", "first", "second")
			if got := dirtree.Describe(t, dir); got != files {
				t.Fatalf("the directory after two clones and their removal:\n%s\nwant it as exported:\n%s", got, files)
			}
		})
	}
}

func TestSnapshotDirectoryRefusals(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	taken := t.TempDir()
	if err := os.WriteFile(filepath.Join(taken, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.fails("export-to-dir: target dir "+taken+" is not empty", "snapshot", "export", "base", "--to-dir", taken)
	s.fails("if any flags in the group [to-dir output] are set none of the others can be; [output to-dir] were all set",
		"snapshot", "export", "base", "--to-dir", filepath.Join(t.TempDir(), "d"), "-o", "-")
	s.fails("export-to-dir: snapshot not found", "snapshot", "export", "nothing", "--to-dir", filepath.Join(t.TempDir(), "d"))

	dir := filepath.Join(t.TempDir(), "base")
	s.ok("snapshot", "export", "base", "--to-dir", dir)
	s.fails("--from-dir and positional SNAPSHOT are mutually exclusive", "vm", "clone", "--name", "c", "--from-dir", dir, "base")
	s.fails("snapshot is required (or use --from-dir)", "vm", "clone", "--name", "c")
	s.fails("load envelope: snapshot.json missing in "+taken+": snapshot envelope missing", "vm", "clone", "--name", "c", "--from-dir", taken)
	if got := s.listVMs(); len(got) != 0 {
		t.Fatalf("refused clones left VMs: %+v", got)
	}

	old := newSimAt(t, "0.3.8")
	old.fails("unknown flag: --to-dir", "snapshot", "export", "base", "--to-dir", filepath.Join(t.TempDir(), "d"))
	old.fails("unknown flag: --from-dir", "vm", "clone", "--name", "c", "--from-dir", dir)
}

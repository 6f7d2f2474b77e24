package cocoonsim_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// fillShm writes into a guest's /dev/shm a directory, files with their own modes (one large
// enough to take more than a buffer to save) and a symlink.
const fillShm = `set -e
mkdir /dev/shm/dir
printf 'kept\n' > /dev/shm/dir/first
head -c 3000000 /dev/urandom > /dev/shm/dir/big
chmod 640 /dev/shm/dir/first
chmod 750 /dev/shm/dir
ln -s dir/first /dev/shm/link`

// describeShm lists a guest's /dev/shm: every entry's type, mode, owner, size and modification
// time, the content of the files and where the link points.
const describeShm = `set -e
cd /dev/shm
find . -exec stat -c '%n %F %a %u:%g %s %Y' {} + | sort
cat dir/first
sha256sum dir/big
readlink link`

// TestGuestRAMTravelsWithSnapshots: what a guest holds in its tmpfs /dev/shm is in its RAM, so a
// snapshot keeps it and every VM restored from the snapshot has it back; what the guest writes
// after the snapshot is not in it, and a cold boot starts with an empty /dev/shm. The memory
// file carries it through a snapshot of a restored guest and through export and import.
func TestGuestRAMTravelsWithSnapshots(t *testing.T) {
	for _, tc := range []struct {
		hypervisor string
		cloneModes [][]string
	}{
		{cocoon.HypervisorCloudHypervisor, [][]string{nil, {"--restore-mode", "ondemand"}, {"--restore-mode", "copy"}}},
		{cocoon.HypervisorFirecracker, [][]string{nil}},
	} {
		t.Run(tc.hypervisor, func(t *testing.T) {
			s := newSimAt(t, "0.5.1")
			s.importSnapshot(testimage.SnapshotOptions{Name: "base", Hypervisor: tc.hypervisor})
			s.clone("base", "src")
			s.inGuest("src", "sh", "-c", fillShm)
			want := s.inGuest("src", "sh", "-c", describeShm)
			s.ok("snapshot", "save", "--name", "golden", "src")
			s.inGuest("src", "sh", "-c", "echo later > /dev/shm/second")

			for i, flags := range tc.cloneModes {
				name := "copy" + string(rune('a'+i))
				s.clone("golden", name, flags...)
				if got := s.inGuest(name, "sh", "-c", describeShm); got != want {
					t.Fatalf("clone %v of the snapshot has in /dev/shm:\n%s\nwant what the source had when saved:\n%s", flags, got, want)
				}
			}
			if got := s.inGuest("src", "cat", "/dev/shm/second"); got != "later\n" {
				t.Fatalf("the source's own later file: %q", got)
			}

			// A restored guest saved again before it changes anything keeps the same RAM.
			s.ok("snapshot", "save", "--name", "second-gen", "copya")
			s.clone("second-gen", "grandchild")
			if got := s.inGuest("grandchild", "sh", "-c", describeShm); got != want {
				t.Fatalf("clone of a clone's snapshot has in /dev/shm:\n%s\nwant:\n%s", got, want)
			}

			// The memory file is the archive's opaque data: it leaves with export and comes
			// back with import.
			exported := filepath.Join(t.TempDir(), "golden.tar")
			s.ok("snapshot", "export", "golden", "-o", exported)
			s.ok("snapshot", "import", "--name", "imported", exported)
			s.ok("snapshot", "rm", "golden")
			s.clone("imported", "from-archive")
			if got := s.inGuest("from-archive", "sh", "-c", describeShm); got != want {
				t.Fatalf("clone of the exported and imported snapshot has in /dev/shm:\n%s\nwant:\n%s", got, want)
			}

			// RAM does not survive a power cycle.
			s.ok("vm", "stop", "from-archive")
			s.ok("vm", "start", "from-archive")
			eventually(t, "the guest's agent after a cold boot", func() bool {
				return s.vmExec("", "from-archive", "--", "true").code == 0
			})
			if got := s.inGuest("from-archive", "ls", "-A", "/dev/shm"); got != "" {
				t.Fatalf("/dev/shm after a cold boot: %q", got)
			}
		})
	}
}

// TestGuestRAMOfASnapshotWithoutOne: a snapshot written without a running guest (testimage's,
// whose memory file is the header alone) restores to an empty /dev/shm.
func TestGuestRAMOfASnapshotWithoutOne(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	vm := s.clone("base", "box")
	mem, err := os.ReadFile(filepath.Join(filepath.Dir(vm.SocketPath), "memory-range-0"))
	if err != nil || string(mem) != "cocoon-sim guest memory of base\n" {
		t.Fatalf("the imported snapshot's memory file: %q, %v", mem, err)
	}
	if got := s.inGuest("box", "sh", "-c", "ls -A /dev/shm; stat -c %a /dev/shm"); got != "1777\n" {
		t.Fatalf("/dev/shm of a guest restored from a memory file without it: %q", got)
	}
}

// TestGuestRAMLeavesMountsOut: a file system the guest mounts inside /dev/shm is not the tmpfs's
// content: the restored guest finds the mount point empty, and the rest as it was.
func TestGuestRAMLeavesMountsOut(t *testing.T) {
	s := newSimAt(t, "0.5.1")
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	s.clone("base", "src")
	s.inGuest("src", "sh", "-c", "mkdir /dev/shm/mnt && mount -t tmpfs none /dev/shm/mnt && echo elsewhere > /dev/shm/mnt/f && echo here > /dev/shm/f")
	s.ok("snapshot", "save", "--name", "golden", "src")
	s.clone("golden", "copy")
	if got := s.inGuest("copy", "sh", "-c", "cat /dev/shm/f; ls -A /dev/shm/mnt; find /dev/shm -type d | sort"); got != "here\n/dev/shm\n/dev/shm/mnt\n" {
		t.Fatalf("the restored guest's /dev/shm: %q", got)
	}
}

package vmruntime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/guestvolume"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The share holds a bind of each volume, read-only where the mount is; taking it down undoes the
// binds and removes only cocoon-cri's own directories, never a volume's files.
func TestShareBindsAndTakeDown(t *testing.T) {
	testproc.RequireRoot(t, "a bind mount")
	rw, ro := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "key"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	shared := []*volumeCopy{
		{mount: &runtimeapi.Mount{ContainerPath: "/data", HostPath: rw}},
		{mount: &runtimeapi.Mount{ContainerPath: "/etc/app", HostPath: ro, Readonly: true}},
	}
	share := store.Share{Dir: filepath.Join(t.TempDir(), "shares", "ctr"), Socket: filepath.Join(t.TempDir(), "ctr.sock")}
	n, err := bindVolumes(share.Dir, shared)
	share.Volumes = n
	t.Cleanup(func() {
		for _, sub := range []string{"0", "1"} {
			_ = unix.Unmount(filepath.Join(share.Dir, sub), unix.MNT_DETACH)
		}
	})
	if err != nil || n != 2 {
		t.Fatalf("bindVolumes: %d, %v", n, err)
	}
	if err := os.WriteFile(filepath.Join(share.Dir, "0", "through-share"), []byte("x"), 0o644); err != nil {
		t.Fatalf("a write through the writable bind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rw, "through-share")); err != nil {
		t.Fatalf("the write did not reach the volume: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(share.Dir, "1", "key")); err != nil || string(got) != "v1" {
		t.Fatalf("the read-only volume through the share: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(share.Dir, "1", "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("a write to the read-only bind: %v, want EROFS", err)
	}

	if err := (&volumeShares{}).takeDown(share); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(share.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the share's directory is left: %v", err)
	}
	for _, f := range []string{filepath.Join(rw, "through-share"), filepath.Join(ro, "key")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("taking the share down touched a volume's file %s: %v", f, err)
		}
	}
	// Again, as a retry after a crash would: nothing left to do, and no error.
	if err := (&volumeShares{}).takeDown(share); err != nil {
		t.Fatalf("taking down a share already gone: %v", err)
	}
}

// Only directories go through the share; a file (the kubelet's /etc/hosts) is still copied.
func TestSplitShared(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "etc-hosts")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	copies := []*volumeCopy{
		{mount: &runtimeapi.Mount{ContainerPath: "/data", HostPath: dir}},
		{mount: &runtimeapi.Mount{ContainerPath: "/etc/hosts", HostPath: file}},
		{mount: &runtimeapi.Mount{ContainerPath: "/linked", HostPath: link}},
	}
	shared, copied := splitShared(copies)
	if len(shared) != 2 || shared[0] != copies[0] || shared[1] != copies[2] || len(copied) != 1 || copied[0] != copies[1] {
		t.Fatalf("shared %v, copied %v", shared, copied)
	}
}

// The guest's script mounts the share once and binds each volume at its path, read-only where
// asked, each step skipped when done (a restart of cocoon-cri runs it again); paths are quoted.
func TestGuestShareScript(t *testing.T) {
	script := guestShareScript([]*volumeCopy{
		{guest: guestvolume.Volume{Target: "/data"}},
		{guest: guestvolume.Volume{Target: "/etc/my app", ReadOnly: true}},
	})
	for _, want := range []string{
		"mountpoint -q /run/cocoon-cri/share || mount -t virtiofs cri-volumes /run/cocoon-cri/share",
		"mountpoint -q '/data'; then\n  mount --bind /run/cocoon-cri/share/0 '/data'\nfi",
		"mount --bind /run/cocoon-cri/share/1 '/etc/my app'\n  mount -o remount,bind,ro '/etc/my app'",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q:\n%s", want, script)
		}
	}
}

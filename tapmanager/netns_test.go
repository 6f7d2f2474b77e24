package tapmanager

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

func TestCreateAndRemoveNetNS(t *testing.T) {
	testproc.RequireRoot(t, "a network namespace")
	n := &NetNS{Dir: filepath.Join(t.TempDir(), "netns")}
	path := n.NetNSPath("0123456789abcdef0123456789abcdef")
	if filepath.Base(path) != "cocoon-cri-0123456789abcdef" {
		t.Fatalf("path %s", path)
	}
	if err := n.CreateNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.RemoveNetNS(path) })

	if !IsNetNS(path) {
		t.Fatalf("%s is not a namespace", path)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if IsNetNS(plain) || IsNetNS(filepath.Join(t.TempDir(), "missing")) || IsNetNS("") {
		t.Fatal("a plain file, a missing one or no path taken for a namespace")
	}
	var ours, pinned unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &ours); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(path, &pinned); err != nil {
		t.Fatal(err)
	}
	if ours.Ino == pinned.Ino {
		t.Fatalf("the pinned namespace is the test's own (inode %d)", ours.Ino)
	}

	if err := n.CreateNetNS(path); err == nil {
		t.Fatal("creating an existing namespace succeeded")
	}
	if err := n.RemoveNetNS(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("namespace file still there: %v", err)
	}
	if err := n.RemoveNetNS(path); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

func TestNamespacesAreDistinct(t *testing.T) {
	testproc.RequireRoot(t, "a network namespace")
	n := &NetNS{Dir: t.TempDir()}
	a, b := n.NetNSPath("aaaaaaaaaaaaaaaaaaaa"), n.NetNSPath("bbbbbbbbbbbbbbbbbbbb")
	for _, p := range []string{a, b} {
		if err := n.CreateNetNS(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.RemoveNetNS(p) })
	}
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sb.Ino {
		t.Fatal("two sandboxes share a namespace")
	}
}

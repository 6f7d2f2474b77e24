package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Write creates and replaces a file with the mode asked for (whatever the umask), leaving no
// temporary file beside it.
func TestWriteReplacesWhole(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"Write": Write, "Replace": Replace} {
		t.Run(name, func(t *testing.T) { testReplacesWhole(t, write) })
	}
}

func testReplacesWhole(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.conflist")
	for _, content := range []string{"first version, longer than the second", "second"} {
		if err := write(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil || string(data) != content {
			t.Fatalf("read back %q, %v; want %q", data, err, content)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
			t.Fatalf("mode %v, %v", fi.Mode(), err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("files beside it: %v", entries)
	}
}

// A write that cannot be made leaves the old file as it was and no temporary file.
func TestFailedWriteKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "holder")
	if err := Write(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory in the way of the rename.
	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(filepath.Join(blocked, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(blocked, []byte("new"), 0o600); err == nil {
		t.Fatal("a write over a non-empty directory succeeded")
	}
	if data, _ := os.ReadFile(path); string(data) != "old" {
		t.Fatalf("the old file: %q", data)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("left behind: %v", entries)
	}
}

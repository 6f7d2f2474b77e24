package guest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// describeTree lists what a saved tmpfs keeps of dir: every entry's type, mode and owner, a file's
// content, a symlink's target, and their modification times.
func describeTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := info.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v %d:%d", rel, info.Mode(), st.Uid, st.Gid)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s %s", target, info.ModTime().UTC().Format(time.RFC3339Nano))
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q %s", data, info.ModTime().UTC().Format(time.RFC3339Nano))
		default:
			fmt.Fprintf(&b, " %s", info.ModTime().UTC().Format(time.RFC3339Nano))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestMemoryFileKeepsTheTmpfs(t *testing.T) {
	src := t.TempDir()
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	for _, step := range []func() error{
		func() error { return os.MkdirAll(filepath.Join(src, "d", "inner"), 0o755) },
		func() error { return os.WriteFile(filepath.Join(src, "d", "inner", "f"), []byte("deep"), 0o600) },
		func() error { return os.WriteFile(filepath.Join(src, "plain"), []byte("hello\n"), 0o644) },
		func() error { return os.WriteFile(filepath.Join(src, "empty"), nil, 0o400) },
		func() error { return os.WriteFile(filepath.Join(src, "suid"), []byte("#!/bin/sh\n"), 0o755) },
		func() error { return os.Chmod(filepath.Join(src, "suid"), 0o755|fs.ModeSetuid) },
		func() error { return os.Symlink("d/inner/f", filepath.Join(src, "rel")) },
		func() error { return os.Symlink("/etc/passwd", filepath.Join(src, "abs")) },
		func() error { return os.Mkdir(filepath.Join(src, "ro"), 0o755) },
		func() error { return os.WriteFile(filepath.Join(src, "ro", "x"), []byte("x"), 0o644) },
		func() error { return os.Chmod(filepath.Join(src, "ro"), 0o555) },
		func() error { return os.Chmod(filepath.Join(src, "d"), 0o700|fs.ModeSticky) },
		func() error { return os.Chmod(src, 0o777|fs.ModeSticky) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"d/inner/f", "plain", "d/inner", "d", "ro", "."} {
		if err := os.Chtimes(filepath.Join(src, p), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	tv := unix.NsecToTimeval(mtime.UnixNano())
	if err := unix.Lutimes(filepath.Join(src, "rel"), []unix.Timeval{tv, tv}); err != nil {
		t.Fatal(err)
	}
	want := describeTree(t, src)

	mem := filepath.Join(t.TempDir(), "memory-range-0")
	if err := writeMemoryFile(mem, "vm1", writeShmSection(src)); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(mem); !bytes.HasPrefix(data, []byte("cocoon-sim guest memory of vm1\n"+memoryShmSection)) {
		t.Fatalf("memory file starts %q", data[:min(len(data), 80)])
	}
	ram, err := openMemoryFile(mem)
	if err != nil || !ram.hasShm() {
		t.Fatalf("open: %v, has tmpfs %v", err, ram.hasShm())
	}
	defer ram.close()
	// The file goes away after the restore; what was restored stays readable, as the
	// hypervisor's copy or mapping of it would.
	if err := os.Remove(mem); err != nil {
		t.Fatal(err)
	}
	tarStart, err := ram.shmTar()
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := readTmpfs(tarStart, dst); err != nil {
		t.Fatal(err)
	}
	if got := describeTree(t, dst); got != want {
		t.Fatalf("restored tree:\n%s\nwant:\n%s", got, want)
	}

	// A snapshot of the restored guest before it ran again holds the same memory.
	again := filepath.Join(t.TempDir(), "mem")
	if err := writeMemoryFile(again, "vm1", ram.copyShmSection); err != nil {
		t.Fatal(err)
	}
	ram2, err := openMemoryFile(again)
	if err != nil || !ram2.hasShm() {
		t.Fatalf("open the copy: %v", err)
	}
	defer ram2.close()
	r2, err := ram2.shmTar()
	if err != nil {
		t.Fatal(err)
	}
	dst2 := t.TempDir()
	if err := readTmpfs(r2, dst2); err != nil {
		t.Fatal(err)
	}
	if got := describeTree(t, dst2); got != want {
		t.Fatalf("tree through a second snapshot:\n%s\nwant:\n%s", got, want)
	}
}

func TestMemoryFileHeader(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		shm           bool
		err           string
	}{
		{"stub", "cocoon-sim guest memory of base\n", false, ""},
		{"not the simulator's", "\x00\x01 raw guest pages", false, ""},
		{"empty", "", false, ""},
		{"with tmpfs", "cocoon-sim guest memory of base\n" + memoryShmSection, true, ""},
		{"damaged", "cocoon-sim guest memory of base\nsomething else\n", false, `unknown content after the header: "something else"`},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		ram, err := openMemoryFile(path)
		if tc.err != "" {
			if err == nil || !strings.HasSuffix(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || ram.hasShm() != tc.shm {
			t.Errorf("%s: %v, has tmpfs %v, want %v", tc.name, err, ram.hasShm(), tc.shm)
		}
		ram.close()
	}
}

// A memory file is read by the guest at restore: no entry may land outside its /dev/shm.
func TestReadTmpfsStaysInside(t *testing.T) {
	for _, name := range []string{"../escape", "/abs", "a/../../escape"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: 1}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte("x"))
		_ = tw.Close()
		parent := t.TempDir()
		dst := filepath.Join(parent, "shm")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := readTmpfs(&buf, dst); err == nil {
			t.Errorf("%q was extracted", name)
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 1 {
			t.Errorf("%q: %v beside the tmpfs", name, entries)
		}
	}
	// Nor through a symlink the tar made itself.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: "..", Mode: 0o777})
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "out/escape", Mode: 0o644})
	_ = tw.Close()
	parent := t.TempDir()
	dst := filepath.Join(parent, "shm")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := readTmpfs(&buf, dst); err == nil {
		t.Error("a file was written through a symlink out of the tmpfs")
	}
	if _, err := os.Lstat(filepath.Join(parent, "escape")); err == nil {
		t.Error("escape written beside the tmpfs")
	}
	// A truncated memory file fails the restore rather than giving the guest part of its RAM.
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("m"), 10000), 0o644); err != nil {
		t.Fatal(err)
	}
	var full bytes.Buffer
	if err := writeTmpfs(&full, src); err != nil {
		t.Fatal(err)
	}
	if err := readTmpfs(io.LimitReader(&full, int64(full.Len()/2)), t.TempDir()); err == nil {
		t.Error("a truncated tar was restored")
	}
}

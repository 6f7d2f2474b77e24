package guestvolume

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var limits = Limits{MaxBytes: 1 << 20, MaxEntries: 100}

// guest stands in for a guest's shell: the script runs with the userland given (GNU's or
// busybox's) in a mount namespace of its own, so its bind mount stays there.
type guest struct {
	t     *testing.T
	path  string // PATH for the script
	shell string
	v     Volume
	file  bool
	tree  *Tree
}

func newGuest(t *testing.T, userland string, target string) *guest {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the guest's bind mount needs root")
	}
	g := &guest{t: t, path: "/usr/bin:/bin:/usr/sbin:/sbin", shell: "/bin/sh"}
	if userland == "busybox" {
		bb, err := exec.LookPath("busybox")
		if err != nil {
			t.Skip("no busybox")
		}
		dir := t.TempDir()
		for _, applet := range []string{"sh", "tar", "cp", "find", "xargs", "mv", "mount", "rm", "mkdir", "dirname", "cat", "readlink"} {
			if err := os.Symlink(bb, filepath.Join(dir, applet)); err != nil {
				t.Fatal(err)
			}
		}
		g.path, g.shell = dir, filepath.Join(dir, "sh")
	}
	g.v = Volume{DataDir: filepath.Join(t.TempDir(), "run", "0"), Target: target, ReadOnly: true}
	return g
}

// sync scans root and applies what changed, as cocoon-cri does; it returns the script's exit code.
func (g *guest) sync(root string) int {
	g.t.Helper()
	return g.syncChanging(root, nil)
}

// syncChanging is sync with change, when not nil, run between the scan and the read of the files:
// the stream the host writes then, cut short if a file it scanned is gone, is what the guest gets.
func (g *guest) syncChanging(root string, change func()) int {
	g.t.Helper()
	next, err := Scan(root, limits)
	if err != nil {
		g.t.Fatal(err)
	}
	u := Diff(g.tree, next)
	if u.Empty() {
		return 0
	}
	if change != nil {
		change()
	}
	var in bytes.Buffer
	if err := u.WriteTar(&in, root, next); err != nil && change == nil {
		g.t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", g.shell, "-c", u.Script(g.v, next.File))
	cmd.Env = []string{"PATH=" + g.path}
	cmd.Stdin = &in
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		g.t.Logf("script exit %d: %s", exit.ExitCode(), out)
		return exit.ExitCode()
	}
	if err != nil {
		g.t.Fatalf("%v: %s", err, out)
	}
	g.tree = &next
	return 0
}

// listing is the guest copy as "path kind [content or target]" lines.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out = append(out, rel+" -> "+target)
		case info.IsDir():
			out = append(out, rel+"/")
		default:
			data, _ := os.ReadFile(p)
			out = append(out, rel+" = "+string(data)+" "+info.Mode().Perm().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// atomicWrite lays out a ConfigMap volume as the kubelet's atomic writer does: a timestamped
// directory, ..data pointing at it, and a link per key through ..data.
func atomicWrite(t *testing.T, dir, stamp string, data map[string]string) {
	t.Helper()
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.MkdirAll(filepath.Join(dir, stamp), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, stamp, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(stamp, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			if _, ok := data[e.Name()]; !ok {
				os.Remove(filepath.Join(dir, e.Name())) //nolint:errcheck
			}
		}
	}
	for k := range data {
		_ = os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k))
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConfigMapSwapsReachTheCopy(t *testing.T) {
	for _, userland := range []string{"gnu", "busybox"} {
		t.Run(userland, func(t *testing.T) {
			g := newGuest(t, userland, filepath.Join(t.TempDir(), "etc", "app"))
			host := t.TempDir()
			atomicWrite(t, host, "..2026_11_25_10_00_00.1", map[string]string{"a": "one", "b": "two"})
			if code := g.sync(host); code != 0 {
				t.Fatalf("first delivery: exit %d", code)
			}
			want := []string{"..2026_11_25_10_00_00.1/", "..2026_11_25_10_00_00.1/a = one -rw-r--r--",
				"..2026_11_25_10_00_00.1/b = two -rw-r--r--", "..data -> ..2026_11_25_10_00_00.1",
				"a -> ..data/a", "b -> ..data/b"}
			if got := listing(t, g.v.DataDir); !slices.Equal(got, want) {
				t.Fatalf("after the first delivery:\n%q\nwant\n%q", got, want)
			}
			if _, err := os.Stat(g.v.DataDir + ".mounted"); err != nil {
				t.Fatalf("no mounted marker: %v", err)
			}

			atomicWrite(t, host, "..2026_11_25_10_01_00.2", map[string]string{"a": "uno", "c": "tres"})
			u := Diff(g.tree, mustScan(t, host))
			if u.Full || len(u.Remove) == 0 || len(u.Links) == 0 {
				t.Fatalf("an update after a swap: %+v", u)
			}
			if code := g.sync(host); code != 0 {
				t.Fatalf("update: exit %d", code)
			}
			want = []string{"..2026_11_25_10_01_00.2/", "..2026_11_25_10_01_00.2/a = uno -rw-r--r--",
				"..2026_11_25_10_01_00.2/c = tres -rw-r--r--", "..data -> ..2026_11_25_10_01_00.2",
				"a -> ..data/a", "c -> ..data/c"}
			if got := listing(t, g.v.DataDir); !slices.Equal(got, want) {
				t.Fatalf("after the swap:\n%q\nwant\n%q", got, want)
			}
			if _, err := os.Stat(g.v.DataDir + ".stage"); err == nil {
				t.Fatal("the staging directory is left behind")
			}
		})
	}
}

// TestACutStreamChangesNothing: a ConfigMap swapped between the scan and the read of its files
// (its old data directory gone) cuts the stream short; the guest applies none of it, even a full
// update that would have removed what the stream lacks, and the next sync brings the swap.
func TestACutStreamChangesNothing(t *testing.T) {
	for _, userland := range []string{"gnu", "busybox"} {
		t.Run(userland, func(t *testing.T) {
			g := newGuest(t, userland, filepath.Join(t.TempDir(), "etc", "app"))
			host := t.TempDir()
			atomicWrite(t, host, "..2026_11_25_10_00_00.1", map[string]string{"a": "one"})
			if code := g.sync(host); code != 0 {
				t.Fatalf("first delivery: exit %d", code)
			}
			before := listing(t, g.v.DataDir)
			g.tree = nil // a full update, as after a restart of cocoon-cri
			code := g.syncChanging(host, func() {
				atomicWrite(t, host, "..2026_11_25_10_01_00.2", map[string]string{"a": "uno"})
			})
			if code != ExitIncomplete {
				t.Fatalf("a cut stream: exit %d, want %d", code, ExitIncomplete)
			}
			if got := listing(t, g.v.DataDir); !slices.Equal(got, before) {
				t.Fatalf("a cut stream changed the copy:\n%q\nwant\n%q", got, before)
			}
			if _, err := os.Stat(g.v.DataDir + ".stage"); err == nil {
				t.Fatal("the staging directory is left behind")
			}
			if code := g.sync(host); code != 0 {
				t.Fatalf("the next sync: exit %d", code)
			}
			want := []string{"..2026_11_25_10_01_00.2/", "..2026_11_25_10_01_00.2/a = uno -rw-r--r--",
				"..data -> ..2026_11_25_10_01_00.2", "a -> ..data/a"}
			if got := listing(t, g.v.DataDir); !slices.Equal(got, want) {
				t.Fatalf("after the next sync:\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// TestTargetThroughASymlink: a guest's /var/run is a link to /run, and the service-account token
// goes to /var/run/secrets/...; the read-only remount must name the mount where it really is.
func TestTargetThroughASymlink(t *testing.T) {
	for _, userland := range []string{"gnu", "busybox"} {
		t.Run(userland, func(t *testing.T) {
			root := t.TempDir()
			if err := os.Mkdir(filepath.Join(root, "run"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("run", filepath.Join(root, "varrun")); err != nil {
				t.Fatal(err)
			}
			g := newGuest(t, userland, filepath.Join(root, "varrun", "secrets", "token"))
			host := t.TempDir()
			atomicWrite(t, host, "..2026_11_25_10_00_00.1", map[string]string{"token": "abc"})
			if code := g.sync(host); code != 0 {
				t.Fatalf("a read-only volume whose target is under a symlink: exit %d", code)
			}
		})
	}
}

func TestKindChangesAndRemovals(t *testing.T) {
	g := newGuest(t, "gnu", filepath.Join(t.TempDir(), "data"))
	host := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(host, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("x/inner", "1")
	write("y", "2")
	write("gone/deep/file", "3")
	if code := g.sync(host); code != 0 {
		t.Fatalf("first: exit %d", code)
	}
	// x becomes a file, y a directory, gone goes.
	for _, p := range []string{"x", "y", "gone"} {
		if err := os.RemoveAll(filepath.Join(host, p)); err != nil {
			t.Fatal(err)
		}
	}
	write("x", "now a file")
	write("y/child", "4")
	if code := g.sync(host); code != 0 {
		t.Fatalf("update: exit %d", code)
	}
	want := []string{"x = now a file -rw-------", "y/", "y/child = 4 -rw-------"}
	if got := listing(t, g.v.DataDir); !slices.Equal(got, want) {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}

	// A guest that lost its copy (a reboot empties /run) says so, and a full update rebuilds it.
	if err := os.RemoveAll(filepath.Dir(g.v.DataDir)); err != nil {
		t.Fatal(err)
	}
	write("z", "5")
	if code := g.sync(host); code != ExitLost {
		t.Fatalf("an update of a lost copy: exit %d, want %d", code, ExitLost)
	}
	g.tree = nil
	if code := g.sync(host); code != 0 {
		t.Fatalf("full update: exit %d", code)
	}
	want = append(want, "z = 5 -rw-------")
	if got := listing(t, g.v.DataDir); !slices.Equal(got, want) {
		t.Fatalf("after the full update\n%q\nwant\n%q", got, want)
	}

	// A full update over a stale copy (cocoon-cri restarted) drops what the host no longer has.
	if err := os.Remove(filepath.Join(host, "z")); err != nil {
		t.Fatal(err)
	}
	g.tree = nil
	if code := g.sync(host); code != 0 {
		t.Fatalf("full update over a stale copy: exit %d", code)
	}
	if got := listing(t, g.v.DataDir); !slices.Equal(got, want[:3]) {
		t.Fatalf("after a full update over a stale copy\n%q\nwant\n%q", got, want[:3])
	}
}

func TestSingleFileIsCopiedOnce(t *testing.T) {
	g := newGuest(t, "busybox", filepath.Join(t.TempDir(), "etc", "hosts"))
	g.v.Once, g.v.ReadOnly = true, false
	host := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(host, []byte("127.0.0.1 pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := g.sync(host); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got := listing(t, g.v.DataDir); !slices.Equal(got, []string{"data = 127.0.0.1 pod\n -rw-r--r--"}) {
		t.Fatalf("copy %q", got)
	}
	if err := os.WriteFile(host, []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := g.sync(host); code != 0 {
		t.Fatalf("second: exit %d", code)
	}
	if got := listing(t, g.v.DataDir); !slices.Equal(got, []string{"data = 127.0.0.1 pod\n -rw-r--r--"}) {
		t.Fatalf("a volume copied once was updated: %q", got)
	}
}

func TestScanRefusesWhatCannotBeCopied(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var tooLarge *TooLargeError
	if _, err := Scan(dir, limits); !errors.As(err, &tooLarge) {
		t.Fatalf("a directory past the byte limit: %v", err)
	}
	many := t.TempDir()
	for i := range 101 {
		if err := os.WriteFile(filepath.Join(many, strings.Repeat("f", 1)+string(rune('a'+i%26))+strings.Repeat("x", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Scan(many, limits); !errors.As(err, &tooLarge) {
		t.Fatalf("a directory past the entry limit: %v", err)
	}
	if _, err := Scan("/dev/null", limits); err == nil || !strings.Contains(err.Error(), "device node") {
		t.Fatalf("a device node: %v", err)
	}
}

func mustScan(t *testing.T, root string) Tree {
	t.Helper()
	tree, err := Scan(root, limits)
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// installed is what `make install` lays out under DESTDIR with the default PREFIX, with each
// file's mode and where its content comes from ("" for the built binary).
var installed = map[string]struct {
	mode fs.FileMode
	from string
}{
	"usr/local/bin/cocoon-cri":                       {0o755, ""},
	"etc/systemd/system/cocoon-cri.service":          {0o644, "deploy/cocoon-cri.service"},
	"etc/cocoon-cri/config.yaml":                     {0o644, "deploy/config.yaml"},
	"etc/crictl.yaml":                                {0o644, "deploy/crictl.yaml"},
	"usr/local/share/cocoon-cri/config.yaml":         {0o644, "deploy/config.yaml"},
	"usr/local/share/cocoon-cri/crictl.yaml":         {0o644, "deploy/crictl.yaml"},
	"usr/local/share/cocoon-cri/kubelet-config.yaml": {0o644, "deploy/kubelet-config.yaml"},
	"usr/local/share/cocoon-cri/runtimeclass.yaml":   {0o644, "deploy/runtimeclass.yaml"},
}

// TestMakeInstallAndRelease runs `make install` and `make release` as deploy/README.md tells an
// operator to, into temporary directories: the node's files where the unit file looks for them,
// an operator's configuration surviving a reinstall, and a release tarball that holds exactly the
// installed files, verifies against its .sha256 and packs to the same bytes twice.
func TestMakeInstallAndRelease(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// The binary goes to a temporary BIN too: the test writes nothing into the checkout.
	bin := filepath.Join(tmp, "bin")
	out, err := exec.Command(filepath.Join(root, "hack", "version.sh")).Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(out))

	dest := filepath.Join(tmp, "root")
	runMake(t, root, "install", "DESTDIR="+dest, "BIN="+bin)
	files := regularFiles(t, dest)
	want := slices.Sorted(maps.Keys(installed))
	if !slices.Equal(files, want) {
		t.Fatalf("make install wrote %q, want %q", files, want)
	}
	for name, f := range installed {
		checkFile(t, dest, name, f.mode, f.from, root, bin)
	}
	out, err = exec.Command(filepath.Join(dest, "usr/local/bin/cocoon-cri"), "--version").Output()
	if err != nil || string(out) != "cocoon-cri "+version+"\n" {
		t.Fatalf("installed cocoon-cri --version: %q, %v; want the version of hack/version.sh, %q", out, err, version)
	}
	// What the unit runs is what was installed.
	checkExecStart(t, dest, "/usr/local/bin/cocoon-cri")

	// A release is the same files, owned by root, as of the commit's time.
	dist := filepath.Join(tmp, "dist")
	runMake(t, root, "release", "DIST="+dist, "BIN="+bin)
	name := "cocoon-cri-" + version + "-linux-" + runtime.GOARCH + ".tar.gz"
	if got := dirNames(t, dist); !slices.Equal(got, []string{name, name + ".sha256"}) {
		t.Fatalf("make release wrote %q, want %s and its .sha256", got, name)
	}
	check := exec.Command("sha256sum", "--check", "--strict", name+".sha256")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum --check %s.sha256: %v\n%s", name, err, out)
	}
	tarball, err := os.ReadFile(filepath.Join(dist, name))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(tarball)
	if line, _ := os.ReadFile(filepath.Join(dist, name+".sha256")); string(line) != hex.EncodeToString(sum[:])+"  "+name+"\n" {
		t.Fatalf("%s.sha256 is %q, want sha256sum's line for the tarball alone (no directory)", name, line)
	}
	var commitTime int64 = -1
	if out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output(); err == nil {
		if commitTime, err = strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	checkTarball(t, tarball, dest, want, commitTime)

	again := filepath.Join(tmp, "dist-again")
	runMake(t, root, "release", "DIST="+again, "BIN="+bin)
	if second, err := os.ReadFile(filepath.Join(again, name)); err != nil || !bytes.Equal(second, tarball) {
		t.Fatalf("a second make release of the same commit differs from the first (%v)", err)
	}

	// Reinstalling over a node whose operator edited the configuration keeps the edits and
	// brings the rest up to date; nothing else changes.
	edited := []byte("# the operator's\n")
	for _, name := range []string{"etc/cocoon-cri/config.yaml", "etc/crictl.yaml"} {
		if err := os.WriteFile(filepath.Join(dest, name), edited, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stale := filepath.Join(dest, "usr/local/share/cocoon-cri/config.yaml")
	if err := os.WriteFile(stale, []byte("an older default\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr := runMake(t, root, "install", "DESTDIR="+dest, "BIN="+bin)
	if files := regularFiles(t, dest); !slices.Equal(files, want) {
		t.Fatalf("a second make install left %q, want %q", files, want)
	}
	for name, f := range installed {
		switch name {
		case "etc/cocoon-cri/config.yaml", "etc/crictl.yaml":
			if got, _ := os.ReadFile(filepath.Join(dest, name)); !bytes.Equal(got, edited) {
				t.Errorf("make install overwrote the operator's %s", name)
			}
			if !strings.Contains(stderr, "kept /"+name) {
				t.Errorf("make install did not say it kept /%s: %q", name, stderr)
			}
		default:
			checkFile(t, dest, name, f.mode, f.from, root, bin)
		}
	}

	// Another PREFIX moves the binary and the defaults, and the unit follows the binary; the
	// configuration stays in /etc, where the unit reads it.
	usr := filepath.Join(tmp, "usr")
	runMake(t, root, "install", "DESTDIR="+usr, "PREFIX=/usr", "BIN="+bin)
	for _, name := range []string{"usr/bin/cocoon-cri", "usr/share/cocoon-cri/runtimeclass.yaml", "etc/cocoon-cri/config.yaml"} {
		if _, err := os.Stat(filepath.Join(usr, name)); err != nil {
			t.Errorf("make install PREFIX=/usr: %v", err)
		}
	}
	checkExecStart(t, usr, "/usr/bin/cocoon-cri")
}

// runMake runs make in the checkout with the Makefile's defaults (none of the variables the test
// is about taken from the caller's environment, nor the make that may be running `go test`) and
// returns its standard error.
func runMake(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "make", append([]string{"-s"}, args...)...)
	cmd.Dir = root
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VERSION", "ARCH", "DIST", "BIN", "DESTDIR", "PREFIX",
			"BINDIR", "DATADIR", "SYSCONFDIR", "SYSTEMDUNITDIR", "SOURCE_DATE_EPOCH":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stdout = io.Discard
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stderr.String()
}

// regularFiles lists the files under dir, relative and sorted, and fails on anything that is
// neither a file nor a directory.
func regularFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return errors.New(path + " is not a regular file")
		}
		rel, err := filepath.Rel(dir, path)
		files = append(files, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	return files
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// checkFile compares an installed file's mode and content with its source.
func checkFile(t *testing.T, dest, name string, mode fs.FileMode, from, root, bin string) {
	t.Helper()
	info, err := os.Stat(filepath.Join(dest, name))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != mode {
		t.Errorf("%s has mode %v, want %v", name, info.Mode().Perm(), mode)
	}
	src := filepath.Join(root, from)
	if from == "" {
		src = filepath.Join(bin, "cocoon-cri")
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, name)); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (%v)", name, src, err)
	}
}

// checkExecStart reads the installed unit's ExecStart and checks that the binary it runs and the
// --config it passes are installed under dest, and the binary is the one expected.
func checkExecStart(t *testing.T, dest, binary string) {
	t.Helper()
	unit, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system/cocoon-cri.service"))
	if err != nil {
		t.Fatal(err)
	}
	var execStart []string
	for line := range strings.Lines(string(unit)) {
		if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = strings.Fields(rest)
		}
	}
	if len(execStart) != 3 || execStart[0] != binary || execStart[1] != "--config" {
		t.Fatalf("unit's ExecStart is %q, want %s --config FILE", execStart, binary)
	}
	for _, path := range []string{execStart[0], execStart[2]} {
		if _, err := os.Stat(filepath.Join(dest, path)); err != nil {
			t.Errorf("the unit runs with %s, which make install did not install: %v", path, err)
		}
	}
}

// checkTarball compares the release tarball's entries with the files installed under dest: the
// same names in sorted order, regular files only, the same modes and contents, owned by root,
// dated at the commit (unless commitTime is -1: no git to ask).
func checkTarball(t *testing.T, tarball []byte, dest string, want []string, commitTime int64) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Typeflag != tar.TypeReg {
			t.Errorf("tarball entry %s has type %q, want only regular files", hdr.Name, hdr.Typeflag)
			continue
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "root" || hdr.Gname != "root" {
			t.Errorf("tarball entry %s is owned by %s:%s (%d:%d), want root:root", hdr.Name, hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid)
		}
		if commitTime >= 0 && hdr.ModTime.Unix() != commitTime {
			t.Errorf("tarball entry %s is dated %v, want the commit's time %d", hdr.Name, hdr.ModTime, commitTime)
		}
		info, err := os.Stat(filepath.Join(dest, hdr.Name))
		if err != nil {
			t.Errorf("tarball entry %s was not installed by make install: %v", hdr.Name, err)
			continue
		}
		if fs.FileMode(hdr.Mode).Perm() != info.Mode().Perm() {
			t.Errorf("tarball entry %s has mode %v, make install gives %v", hdr.Name, fs.FileMode(hdr.Mode).Perm(), info.Mode().Perm())
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if installed, _ := os.ReadFile(filepath.Join(dest, hdr.Name)); !bytes.Equal(got, installed) {
			t.Errorf("tarball entry %s differs from what make install wrote", hdr.Name)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("tarball holds %q, want %q in this order", names, want)
	}
}

package testimage_test

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

const testAuthorizedKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIL2C3FuoQG8R0oRvmgF0YXt37dTd+Osn3bjLFq88howp test"

type entry struct {
	hdr  *tar.Header
	data []byte
}

func readArchive(t *testing.T, data []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		out = append(out, entry{hdr, body})
	}
}

func names(entries []entry) []string {
	var n []string
	for _, e := range entries {
		n = append(n, e.hdr.Name)
	}
	return n
}

func TestSnapshotArchiveLayouts(t *testing.T) {
	for _, tc := range []struct {
		opts testimage.SnapshotOptions
		want []string
	}{
		{testimage.SnapshotOptions{Name: "oci"}, []string{"snapshot.json", "cocoon.json", "config.json", "cow.raw", "memory-range-0", "state.json"}},
		{testimage.SnapshotOptions{Name: "uefi", ImageType: cocoon.ImageTypeCloudImg, Guest: guest.Spec{IgnorePowerButton: true}},
			[]string{"snapshot.json", "cidata.img", guest.SpecFile, "cocoon.json", "config.json", "memory-range-0", "overlay.qcow2", "state.json"}},
		{testimage.SnapshotOptions{Name: "fc", Hypervisor: cocoon.HypervisorFirecracker}, []string{"snapshot.json", "cocoon.json", "cow.raw", "mem", "vmstate"}},
	} {
		var buf bytes.Buffer
		if err := testimage.WriteSnapshotArchive(&buf, tc.opts); err != nil {
			t.Fatal(err)
		}
		entries := readArchive(t, buf.Bytes())
		if got := strings.Join(names(entries), " "); got != strings.Join(tc.want, " ") {
			t.Errorf("%s: entries %q, want %q", tc.opts.Name, got, strings.Join(tc.want, " "))
		}
		var env cocoon.SnapshotExport
		if err := json.Unmarshal(entries[0].data, &env); err != nil {
			t.Fatal(err)
		}
		if env.Version != 1 || env.Config.Name != tc.opts.Name || env.Config.CPU != 1 || env.Config.Memory != 512<<20 || env.Config.Storage != 10<<30 {
			t.Errorf("%s: snapshot.json %+v", tc.opts.Name, env)
		}
	}
}

func TestSnapshotArchiveSparseCOW(t *testing.T) {
	var buf bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&buf, testimage.SnapshotOptions{Storage: 12 << 30}); err != nil {
		t.Fatal(err)
	}
	for _, e := range readArchive(t, buf.Bytes()) {
		if e.hdr.Name != "cow.raw" {
			continue
		}
		if e.hdr.PAXRecords["COCOON.sparse.size"] != "12884901888" || e.hdr.PAXRecords["COCOON.sparse.map"] != `[{"o":0,"l":4096}]` || len(e.data) != 4096 {
			t.Fatalf("cow.raw entry: %+v (%d data bytes)", e.hdr.PAXRecords, len(e.data))
		}
		return
	}
	t.Fatal("no cow.raw")
}

func TestInstallBaseFiles(t *testing.T) {
	root := t.TempDir()
	for _, opts := range []testimage.SnapshotOptions{{RootDir: root}, {RootDir: root, ImageType: cocoon.ImageTypeCloudImg}} {
		if err := testimage.InstallBaseFiles(opts); err != nil {
			t.Fatal(err)
		}
	}
	for _, pattern := range []string{"oci/blobs/*.erofs", "oci/boot/*/vmlinuz", "oci/boot/*/initrd.img", "cloudimg/blobs/*.qcow2", "firmware/CLOUDHV.fd"} {
		if m, _ := filepath.Glob(filepath.Join(root, pattern)); len(m) != 1 {
			t.Errorf("%s: %v", pattern, m)
		}
	}
}

func TestQCOW2Header(t *testing.T) {
	var buf bytes.Buffer
	if err := testimage.WriteQCOW2(&buf, 10<<30); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	be := binary.BigEndian
	if string(b[:4]) != "QFI\xfb" || be.Uint32(b[4:]) != 3 || be.Uint64(b[8:]) != 0 || be.Uint64(b[24:]) != 10<<30 || be.Uint32(b[36:]) != 20 {
		t.Fatalf("header: magic %q version %d backing %d size %d l1 %d", b[:4], be.Uint32(b[4:]), be.Uint64(b[8:]), be.Uint64(b[24:]), be.Uint32(b[36:]))
	}
	if len(b)%65536 != 0 {
		t.Fatalf("image length %d is not whole clusters", len(b))
	}
	if err := testimage.WriteQCOW2(io.Discard, 0); err == nil {
		t.Fatal("a zero-size image must be refused")
	}
}

func TestQCOW2GuestExtensionRoundTrips(t *testing.T) {
	spec := guest.Spec{HTTPPort: 80, PoweroffAfter: guest.Duration(time.Minute), SSHAuthorizedKey: testAuthorizedKey}
	var buf bytes.Buffer
	if err := testimage.WriteQCOW2WithGuest(&buf, 1<<30, spec); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if typ := binary.BigEndian.Uint32(b[104:]); typ != guest.QCOW2SpecExtension {
		t.Fatalf("first header extension has type %#x", typ)
	}
	data, err := guest.ReadQCOW2Spec(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if parsed, err := guest.ParseSpec(data); err != nil || parsed != spec {
		t.Fatalf("behaviour read back: %+v, %v", parsed, err)
	}

	// Without a behaviour the image is the plain one, and has no extension.
	var plain, zero bytes.Buffer
	if err := testimage.WriteQCOW2(&plain, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteQCOW2WithGuest(&zero, 1<<30, guest.Spec{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Bytes(), zero.Bytes()) {
		t.Fatal("a zero behaviour changed the image")
	}
	if data, err := guest.ReadQCOW2Spec(bytes.NewReader(plain.Bytes())); data != nil || err != nil {
		t.Fatalf("plain image extension: %q, %v", data, err)
	}
	if err := testimage.WriteQCOW2WithGuest(io.Discard, 1<<30, guest.Spec{HTTPPort: guest.ProbePort}); err == nil {
		t.Fatal("an image with an impossible behaviour was written")
	}
}

func TestQCOW2AcceptedByQemuImg(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed: only the header test runs")
	}
	for name, spec := range map[string]guest.Spec{"plain": {}, "guest": {HTTPPort: 80, SSHAuthorizedKey: testAuthorizedKey}} {
		dir := t.TempDir()
		path := filepath.Join(dir, "disk.qcow2")
		writeQCOW2File(t, path, spec)
		out, err := exec.Command(qemuImg, "info", "--output=json", path).Output()
		if err != nil {
			t.Fatalf("%s: qemu-img info: %v", name, err)
		}
		var info struct {
			Format      string `json:"format"`
			VirtualSize int64  `json:"virtual-size"`
		}
		if err := json.Unmarshal(out, &info); err != nil || info.Format != "qcow2" || info.VirtualSize != 3<<30 {
			t.Fatalf("%s: qemu-img info: %s (%v)", name, out, err)
		}
		overlay := filepath.Join(dir, "overlay.qcow2")
		for _, argv := range [][]string{
			{"check", path},
			{"create", "-f", "qcow2", "-F", "qcow2", "-b", path, overlay},
			{"check", overlay},
			{"info", "--backing-chain", overlay},
		} {
			if out, err := exec.Command(qemuImg, argv...).CombinedOutput(); err != nil {
				t.Fatalf("%s: qemu-img %s: %v\n%s", name, argv[0], err, out)
			}
		}
	}
}

// QEMU keeps header extensions it does not know when it rewrites the header, but a converted
// image is a new one without them.
func TestQCOW2GuestExtensionThroughQemuImg(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed")
	}
	spec := guest.Spec{FailBoot: true}
	dir := t.TempDir()
	path, converted := filepath.Join(dir, "disk.qcow2"), filepath.Join(dir, "converted.qcow2")
	writeQCOW2File(t, path, spec)
	for _, argv := range [][]string{
		{"amend", "-o", "lazy_refcounts=on", path},
		{"convert", "-f", "qcow2", "-O", "qcow2", "-o", "compat=1.1", path, converted},
	} {
		if out, err := exec.Command(qemuImg, argv...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %s: %v\n%s", argv[0], err, out)
		}
	}
	if parsed, err := guest.ParseSpec(readQCOW2Spec(t, path)); err != nil || parsed != spec {
		t.Fatalf("behaviour after qemu-img amend: %+v, %v", parsed, err)
	}
	if data := readQCOW2Spec(t, converted); data != nil {
		t.Fatalf("qemu-img convert kept the behaviour: %s", data)
	}
}

func writeQCOW2File(t *testing.T, path string, spec guest.Spec) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteQCOW2WithGuest(f, 3<<30, spec); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readQCOW2Spec(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck
	data, err := guest.ReadQCOW2Spec(f)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestOCILayer(t *testing.T) {
	var buf bytes.Buffer
	spec := guest.Spec{CrashAfter: guest.Duration(2 * time.Second)}
	if err := testimage.WriteOCILayer(&buf, testimage.LayerOptions{Guest: spec}); err != nil {
		t.Fatal(err)
	}
	entries := readArchive(t, buf.Bytes())
	if got := strings.Join(names(entries), " "); got != "boot/ boot/vmlinuz boot/initrd.img "+guest.SpecFile {
		t.Fatalf("layer entries: %s", got)
	}
	parsed, err := guest.ParseSpec(entries[3].data)
	if err != nil || parsed != spec {
		t.Fatalf("behaviour file: %+v, %v", parsed, err)
	}
}

func TestGuestServicesTravelWithImagesAndSnapshots(t *testing.T) {
	spec := guest.Spec{HTTPPort: 80, SSHAuthorizedKey: testAuthorizedKey}
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{Guest: spec}); err != nil {
		t.Fatal(err)
	}
	var snapshot bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&snapshot, testimage.SnapshotOptions{Name: "svc", Guest: spec}); err != nil {
		t.Fatal(err)
	}
	for what, archive := range map[string][]byte{"layer": layer.Bytes(), "snapshot": snapshot.Bytes()} {
		var found bool
		for _, e := range readArchive(t, archive) {
			if e.hdr.Name != guest.SpecFile {
				continue
			}
			found = true
			if parsed, err := guest.ParseSpec(e.data); err != nil || parsed != spec {
				t.Errorf("%s behaviour file: %+v, %v", what, parsed, err)
			}
		}
		if !found {
			t.Errorf("%s has no behaviour file", what)
		}
	}
	bad := guest.Spec{HTTPPort: guest.ProbePort}
	if err := testimage.WriteOCILayer(io.Discard, testimage.LayerOptions{Guest: bad}); err == nil {
		t.Error("a layer with an impossible behaviour was written")
	}
	if err := testimage.WriteSnapshotArchive(io.Discard, testimage.SnapshotOptions{Guest: bad}); err == nil {
		t.Error("a snapshot with an impossible behaviour was written")
	}
}

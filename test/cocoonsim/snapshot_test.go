package cocoonsim_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

func archive(t *testing.T, opts testimage.SnapshotOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&buf, opts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var importedRE = regexp.MustCompile(`snapshot imported: ([A-Z2-7]{26}) func=cmd\.snapshot\.import`)

func TestSnapshotImportPrintsNoJSON(t *testing.T) {
	s := newSim(t)
	file := filepath.Join(filepath.Dir(s.root), "snap.tar")
	if err := os.WriteFile(file, archive(t, testimage.SnapshotOptions{Name: "fromfile", RootDir: s.root}), 0o600); err != nil {
		t.Fatal(err)
	}
	r := s.cocoon("snapshot", "import", file)
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("import: exit %d, stdout %q, stderr %s", r.code, r.stdout, stripANSI(r.stderr))
	}
	m := importedRE.FindStringSubmatch(stripANSI(r.stderr))
	if m == nil {
		t.Fatalf("no ID in the import log: %s", stripANSI(r.stderr))
	}
	snap := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "fromfile"))
	if snap.ID != m[1] || snap.Name != "fromfile" || snap.CPU != 1 || snap.Memory != 512<<20 ||
		snap.Hypervisor != cocoon.HypervisorCloudHypervisor || snap.ImageType != cocoon.ImageTypeOCI || snap.CreatedAt.IsZero() {
		t.Fatalf("unexpected snapshot: %+v", snap)
	}
	// Prefix refs work from three characters on.
	if got := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", m[1][:3])); got.ID != m[1] {
		t.Fatalf("prefix ref resolved to %s", got.ID)
	}
}

func TestSnapshotImportFromGzipStdinWithOverrides(t *testing.T) {
	s := newSim(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(archive(t, testimage.SnapshotOptions{Name: "orig", Description: "d0", RootDir: s.root}))
	_ = zw.Close()
	if r := s.cocoonIn(nil, &gz, "snapshot", "import", "--name", "over", "--description", "d1"); r.code != 0 {
		t.Fatalf("gzip import: %s", stripANSI(r.stderr))
	}
	snap := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "over"))
	if snap.Description != "d1" {
		t.Fatalf("description not overridden: %+v", snap)
	}
	s.fails("inspect: snapshot not found", "snapshot", "inspect", "orig")
}

func TestSnapshotImportErrors(t *testing.T) {
	s := newSim(t)
	data := archive(t, testimage.SnapshotOptions{Name: "dup", RootDir: s.root})
	if r := s.cocoonIn(nil, bytes.NewReader(data), "snapshot", "import"); r.code != 0 {
		t.Fatal(stripANSI(r.stderr))
	}
	id := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "dup")).ID
	r := s.cocoonIn(nil, bytes.NewReader(data), "snapshot", "import")
	if r.code != 1 || r.errorLine() != `Error: import: snapshot name "dup" already in use by `+id {
		t.Fatalf("duplicate import: exit %d, %q", r.code, r.errorLine())
	}

	onlyMeta := tarOf(t, map[string][]byte{"snapshot.json": []byte(`{"config":{"name":"meta-only"},"version":1}`)})
	if r := s.cocoonIn(nil, bytes.NewReader(onlyMeta), "snapshot", "import"); r.code != 0 {
		t.Fatalf("contents are not validated, a tar with only snapshot.json is accepted: %s", stripANSI(r.stderr))
	}
	badVersion := tarOf(t, map[string][]byte{"snapshot.json": []byte(`{"config":{},"version":2}`)})
	if r := s.cocoonIn(nil, bytes.NewReader(badVersion), "snapshot", "import"); r.errorLine() != "Error: import: unsupported snapshot archive version 2" {
		t.Fatalf("version 2: %q", r.errorLine())
	}
	noMeta := tarOf(t, map[string][]byte{"config.json": []byte(`{}`)})
	if r := s.cocoonIn(nil, bytes.NewReader(noMeta), "snapshot", "import"); r.errorLine() != "Error: import: invalid snapshot archive: snapshot.json not found" {
		t.Fatalf("no snapshot.json: %q", r.errorLine())
	}
	if r := s.cocoonIn(nil, strings.NewReader(""), "snapshot", "import"); r.errorLine() != "Error: import: peek archive header: EOF" {
		t.Fatalf("empty stdin: %q", r.errorLine())
	}
}

func tarOf(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(data)), Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(data)
	}
	_ = tw.Close()
	return buf.Bytes()
}

func TestSnapshotExportRoundTrip(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "round", Storage: 20 << 30})
	exported := s.ok("snapshot", "export", "round", "-o", "-")
	tr := tar.NewReader(strings.NewReader(exported))
	first, err := tr.Next()
	if err != nil || first.Name != "snapshot.json" {
		t.Fatalf("first entry %v, %v; want snapshot.json", first, err)
	}
	meta, _ := io.ReadAll(tr)
	var env cocoon.SnapshotExport
	if err := json.Unmarshal(meta, &env); err != nil || env.Version != 1 || env.Config.Name != "round" || env.Config.Storage != 20<<30 || env.Config.ID == "" {
		t.Fatalf("snapshot.json: %v %+v", err, env)
	}
	names := map[string]*tar.Header{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[hdr.Name] = hdr
	}
	for _, want := range []string{"config.json", "state.json", "memory-range-0", "cow.raw", "cocoon.json"} {
		if names[want] == nil {
			t.Errorf("export lacks %s (has %v)", want, names)
		}
	}
	if cow := names["cow.raw"]; cow == nil || cow.PAXRecords["COCOON.sparse.size"] != "21474836480" || cow.PAXRecords["COCOON.sparse.map"] == "" {
		t.Errorf("cow.raw must stay a sparse entry: %+v", cow)
	}
	// Re-importing the export under a new name gives an equal snapshot.
	if r := s.cocoonIn(nil, strings.NewReader(exported), "snapshot", "import", "--name", "again"); r.code != 0 {
		t.Fatal(stripANSI(r.stderr))
	}
	// Default output file: <name>.tar in the working directory.
	dir := t.TempDir()
	r := runSimIn(t, dir, append(s.globalFlags(), "snapshot", "export", "again", "--gzip")...)
	if r.code != 0 {
		t.Fatal(stripANSI(r.stderr))
	}
	if _, err := os.Stat(filepath.Join(dir, "again.tar.gz")); err != nil {
		t.Fatalf("default export file: %v", err)
	}
}

func TestSnapshotRemove(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "gone"})
	r := s.cocoon("snapshot", "rm", "gone")
	if r.code != 0 || !strings.Contains(stripANSI(r.stderr), "INF deleted: ") {
		t.Fatalf("rm: %d %s", r.code, stripANSI(r.stderr))
	}
	if got := s.ok("snapshot", "ls", "-o", "json"); got != "No snapshots found.\n" {
		t.Fatalf("after rm: %q", got)
	}
	entries, _ := os.ReadDir(filepath.Join(s.root, "snapshot", "localfile"))
	if len(entries) != 0 {
		t.Fatalf("snapshot data left behind: %v", entries)
	}
}

package imagestore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/sparse"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/dirtree"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// writeFile writes data to a new file of the test and returns its path, gzip-compressed when asked.
func writeFile(t *testing.T, name string, data []byte, gzipped bool) string {
	t.Helper()
	if gzipped {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		data = buf.Bytes()
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rebuild pulls repoTag's snapshot the way a pull does and returns the archive it feeds cocoon,
// with the manifest it read.
func (r *testRegistry) rebuild(t *testing.T, repoTag, localName string) ([]byte, *v1.Manifest, *snapshotConfig) {
	t.Helper()
	ctx := context.Background()
	session, art := r.resolve(t, repoTag)
	if art.kind != store.ImageSnapshot {
		t.Fatalf("%s is a %s, not a snapshot", repoTag, art.kind)
	}
	cfg, err := fetchSnapshotConfig(ctx, session, art.manifest.Config, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var rebuilt bytes.Buffer
	if err := writeSnapshotArchive(ctx, &rebuilt, localName, cfg, art.manifest.Layers, session, io.Discard); err != nil {
		t.Fatal(err)
	}
	return rebuilt.Bytes(), art.manifest, cfg
}

// A snapshot export pushed by cocoon-cri comes back from the pull as the very archive cocoon
// exported, plain or gzipped: snapshot.json, the files in order with their contents, modes and
// sparse records (the entries' time is the artifact's creation time, here the archive's own).
func TestPushedSnapshotIsRebuiltByteForByte(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	i := 0
	for name, opts := range snapshotLayouts {
		for _, gzipped := range []bool{false, true} {
			i++
			t.Run(fmt.Sprintf("%s, gzip %v", name, gzipped), func(t *testing.T) {
				original := snapshotArchive(t, opts)
				path := writeFile(t, "snap.tar", original, gzipped)
				repoTag := fmt.Sprintf("pushed/snap%d:v1", i)
				res, err := Push(context.Background(), path, reg.ref(repoTag), PushOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if res.Ref != reg.ref(repoTag) || !strings.HasPrefix(res.Digest, "sha256:") || res.Checkpoint != nil || len(res.Uncarried) != 0 {
					t.Fatalf("result %+v", res)
				}
				rebuilt, manifest, cfg := reg.rebuild(t, repoTag, opts.Name)
				if !bytes.Equal(rebuilt, original) {
					t.Fatalf("the rebuilt archive differs:\noriginal %s\nrebuilt  %s", describeTar(t, original), describeTar(t, rebuilt))
				}
				if _, ok := manifest.Annotations[annotationCreated]; !ok || cfg.SchemaVersion != "v1" {
					t.Fatalf("annotations %v, config schema %q", manifest.Annotations, cfg.SchemaVersion)
				}
				if res.Files != len(manifest.Layers) {
					t.Fatalf("%d files pushed, %d layers", res.Files, len(manifest.Layers))
				}
			})
		}
	}
}

// What cocoon-cri pushes is what epoch pushes: the test registry's pusher, written from epoch's
// sources independently of imagestore, makes the same layers and the same config blob.
func TestPushMatchesEpochsFormat(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	ctx := context.Background()
	original := snapshotArchive(t, testimage.SnapshotOptions{Name: "snap", CPU: 2, NICs: 1, Description: "epoch"})
	hdr, err := tar.NewReader(bytes.NewReader(original)).Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.direct.PushSnapshot(ctx, "epoch/snap:v1", bytes.NewReader(original), registry.SnapshotPush{CreatedAt: hdr.ModTime}); err != nil {
		t.Fatal(err)
	}
	if _, err := Push(ctx, writeFile(t, "snap.tar", original, false), reg.ref("ours/snap:v1"), PushOptions{}); err != nil {
		t.Fatal(err)
	}
	_, epoch := reg.resolve(t, "epoch/snap:v1")
	_, ours := reg.resolve(t, "ours/snap:v1")
	if ours.manifest.ArtifactType != epoch.manifest.ArtifactType || ours.manifest.MediaType != epoch.manifest.MediaType {
		t.Fatalf("manifest types %q %q, epoch's %q %q", ours.manifest.ArtifactType, ours.manifest.MediaType, epoch.manifest.ArtifactType, epoch.manifest.MediaType)
	}
	if !reflect.DeepEqual(ours.manifest.Layers, epoch.manifest.Layers) {
		t.Fatalf("layers\n%+v\nepoch's\n%+v", ours.manifest.Layers, epoch.manifest.Layers)
	}
	if !reflect.DeepEqual(ours.manifest.Config, epoch.manifest.Config) {
		t.Fatalf("config %+v, epoch's %+v", ours.manifest.Config, epoch.manifest.Config)
	}
	if !maps.Equal(ours.manifest.Annotations, epoch.manifest.Annotations) {
		t.Fatalf("annotations %v, epoch's %v", ours.manifest.Annotations, epoch.manifest.Annotations)
	}
	// The sparse COW disk's records are in the config.
	cfg, err := fetchSnapshotConfig(ctx, reg.resolveSession(t, "ours/snap:v1"), ours.manifest.Config, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cow := cfg.Files["cow.raw"]
	if cow.SparseMap == "" || cow.SparseSize != 10<<30 || cow.Mode != 0o600 {
		t.Fatalf("cow.raw's record %+v", cow)
	}
	if cfg.CPU != 2 || cfg.Memory != 512<<20 || cfg.Storage != 10<<30 || cfg.Image != testimage.DefaultBaseImage ||
		!strings.HasPrefix(cfg.ImageDigest, "sha256:") || cfg.Hypervisor != cocoon.HypervisorCloudHypervisor ||
		cfg.NICs != 1 || cfg.Description != "epoch" || cfg.ImageType != cocoon.ImageTypeOCI || len(cfg.ImageBlobIDs) != 1 {
		t.Fatalf("config %+v", cfg)
	}
}

// resolveSession is the registry session resolve uses.
func (r *testRegistry) resolveSession(t *testing.T, repoTag string) *registrySession {
	t.Helper()
	session, _ := r.resolve(t, repoTag)
	return session
}

// A pushed snapshot is an image like any other: a pull imports it into cocoon, by the digest the
// push printed.
func TestPushThenPull(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	ctx := context.Background()
	path := writeFile(t, "snap.tar", snapshotArchive(t, testimage.SnapshotOptions{Name: "snap", CPU: 2, Memory: 1 << 30}), true)
	res, err := Push(ctx, path, reg.ref("team/snap:v1"), PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img, err := n.svc.Pull(ctx, res.Ref, Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != res.Digest || img.Kind != store.ImageSnapshot || img.Snapshot == nil || img.Snapshot.CPU != 2 || img.Snapshot.Memory != 1<<30 {
		t.Fatalf("pulled %+v (snapshot %+v), pushed %s", img, img.Snapshot, res.Digest)
	}
	snaps, err := n.cocoon.SnapshotList(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].Name != img.LocalName {
		t.Fatalf("cocoon snapshots %+v, %v", snaps, err)
	}
	if byDigest, err := n.svc.Pull(ctx, res.DigestRef(), Credentials{}); err != nil || byDigest.ID != img.ID {
		t.Fatalf("pull of %s: %+v, %v", res.DigestRef(), byDigest, err)
	}

	// The same archive pushed again is the same artifact.
	again, err := Push(ctx, path, reg.ref("team/snap:v2"), PushOptions{})
	if err != nil || again.Digest != res.Digest {
		t.Fatalf("second push: %+v, %v; want digest %s", again, err, res.Digest)
	}
}

// A checkpoint archive is pushed as the snapshot it holds; its metadata is an annotation, not a
// file of the snapshot.
func TestPushCheckpointArchive(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	export := snapshotArchive(t, testimage.SnapshotOptions{Name: "snap"})
	md := &checkpoint.Metadata{
		Version:   checkpoint.FormatVersion,
		CreatedAt: time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC),
		Pod:       checkpoint.Pod{Name: "web", Namespace: "default", UID: "u1", SandboxID: "s1"},
		Container: checkpoint.Container{Name: "app", ID: "c1", Image: "cocoon.local/app:v1"},
		// Long enough that the metadata entry's padding is not trivial.
		Hypervisor: cocoon.HypervisorCloudHypervisor, BaseImage: strings.Repeat("b", 300), CPU: 1, MemoryBytes: 512 << 20,
	}
	var archive bytes.Buffer
	if err := checkpoint.Write(&archive, md, func(w io.Writer) error { _, err := w.Write(export); return err }); err != nil {
		t.Fatal(err)
	}
	for _, gzipped := range []bool{false, true} {
		t.Run(fmt.Sprintf("gzip %v", gzipped), func(t *testing.T) {
			repoTag := fmt.Sprintf("checkpoints/web:gzip-%v", gzipped)
			res, err := Push(context.Background(), writeFile(t, "checkpoint.tar", archive.Bytes(), gzipped), reg.ref(repoTag), PushOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Checkpoint == nil || res.Checkpoint.Pod != md.Pod {
				t.Fatalf("result's checkpoint %+v", res.Checkpoint)
			}
			rebuilt, manifest, _ := reg.rebuild(t, repoTag, "snap")
			if !bytes.Equal(rebuilt, export) {
				t.Fatalf("the rebuilt archive is not the checkpoint's export:\nexport  %s\nrebuilt %s", describeTar(t, export), describeTar(t, rebuilt))
			}
			for _, l := range manifest.Layers {
				if title(l) == checkpoint.MetadataName {
					t.Fatalf("the metadata is a layer: %+v", l)
				}
			}
			var got checkpoint.Metadata
			if err := json.Unmarshal([]byte(manifest.Annotations[AnnotationCheckpoint]), &got); err != nil {
				t.Fatalf("annotation %q: %v", manifest.Annotations[AnnotationCheckpoint], err)
			}
			if !reflect.DeepEqual(&got, md) {
				t.Fatalf("annotation's metadata %+v, want %+v", got, md)
			}
		})
	}
}

// A snapshot directory, as `cocoon snapshot export --to-dir` writes it, is pushed as the very
// artifact of the archive cocoon would export of it: the same layers, sparse records and config,
// so the same digest; and WriteSnapshotDir (what an import sends) writes that archive byte for
// byte. The container's directory of a pod checkpoint carries its metadata from pod.json, as the
// container's checkpoint archive does.
func TestPushSnapshotDirectory(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	ctx := context.Background()
	i := 0
	for name, opts := range snapshotLayouts {
		i++
		t.Run(name, func(t *testing.T) {
			original := snapshotArchive(t, opts)
			dir := filepath.Join(t.TempDir(), "snap")
			extractSnapshot(t, original, dir)
			fromArchive, err := Push(ctx, writeFile(t, "snap.tar", original, false), reg.ref(fmt.Sprintf("archive/snap%d:v1", i)), PushOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var announced []string
			fromDir, err := Push(ctx, dir, reg.ref(fmt.Sprintf("dir/snap%d:v1", i)), PushOptions{OnFile: func(name string, _ int64) { announced = append(announced, name) }})
			if err != nil {
				t.Fatal(err)
			}
			if fromDir.Digest != fromArchive.Digest || fromDir.Files != fromArchive.Files || fromDir.Bytes != fromArchive.Bytes || fromDir.Checkpoint != nil {
				t.Fatalf("the directory pushed %+v, its archive %+v", fromDir, fromArchive)
			}
			if !slices.IsSorted(announced) || len(announced) != fromDir.Files || slices.Contains(announced, snapshotManifest) {
				t.Fatalf("files pushed %v", announced)
			}
			rebuilt, _, _ := reg.rebuild(t, fmt.Sprintf("dir/snap%d:v1", i), opts.Name)
			if !bytes.Equal(rebuilt, original) {
				t.Fatalf("the rebuilt archive differs:\noriginal %s\nrebuilt  %s", describeTar(t, original), describeTar(t, rebuilt))
			}
			// What an import sends of the directory is the archive it was exported from.
			var written bytes.Buffer
			if err := WriteSnapshotDir(&written, dir); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(written.Bytes(), original) {
				t.Fatalf("the directory's archive differs:\noriginal %s\nwritten  %s", describeTar(t, original), describeTar(t, written.Bytes()))
			}
		})
	}

	t.Run("a pod checkpoint's container", func(t *testing.T) {
		export := snapshotArchive(t, testimage.SnapshotOptions{Name: "snap"})
		md := &checkpoint.Metadata{
			Version: checkpoint.FormatVersion, CreatedAt: time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC),
			Pod:        checkpoint.Pod{Name: "web", Namespace: "default", UID: "u1", SandboxID: "s1"},
			Container:  checkpoint.Container{Name: "app", ID: "c1", Image: "cocoon.local/app:v1"},
			Hypervisor: cocoon.HypervisorCloudHypervisor, CPU: 1, MemoryBytes: 512 << 20,
		}
		var archive bytes.Buffer
		if err := checkpoint.Write(&archive, md, func(w io.Writer) error { _, err := w.Write(export); return err }); err != nil {
			t.Fatal(err)
		}
		pod := t.TempDir()
		meta, err := json.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pod, checkpoint.PodFile), []byte(podJSON(`[{"name":"app","snapshot":"c1","metadata":`+string(meta)+`}]`)), 0o600); err != nil {
			t.Fatal(err)
		}
		extractSnapshot(t, export, filepath.Join(pod, "c1"))
		before := dirtree.Describe(t, pod)
		fromArchive, err := Push(ctx, writeFile(t, "c1.tar", archive.Bytes(), false), reg.ref("checkpoints/web:archive"), PushOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fromDir, err := Push(ctx, filepath.Join(pod, "c1"), reg.ref("checkpoints/web:dir"), PushOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if fromDir.Digest != fromArchive.Digest || !reflect.DeepEqual(fromDir.Checkpoint, md) {
			t.Fatalf("the directory pushed %+v (checkpoint %+v), its archive %+v", fromDir, fromDir.Checkpoint, fromArchive)
		}
		// The pod checkpoint of one container is that container's.
		fromPod, err := Push(ctx, pod, reg.ref("checkpoints/web:pod"), PushOptions{})
		if err != nil || fromPod.Digest != fromArchive.Digest {
			t.Fatalf("the pod checkpoint pushed %+v, %v; its container's archive %s", fromPod, err, fromArchive.Digest)
		}
		var written bytes.Buffer
		if err := WriteSnapshotDir(&written, filepath.Join(pod, "c1")); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(written.Bytes(), archive.Bytes()) {
			t.Fatalf("the directory's archive is not the container's checkpoint archive:\narchive %s\nwritten %s", describeTar(t, archive.Bytes()), describeTar(t, written.Bytes()))
		}
		if after := dirtree.Describe(t, pod); after != before {
			t.Fatalf("the push and the archive changed the checkpoint:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// extractSnapshot writes a snapshot archive's files into dir as cocoon keeps a snapshot directory:
// a sparse entry's data at its segments in a file of its size, every file with its entry's mode
// and time.
func extractSnapshot(t *testing.T, archive []byte, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, hdr.Name)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fs.FileMode(hdr.Mode).Perm())
		if err != nil {
			t.Fatal(err)
		}
		segments := []sparse.Segment{{Offset: 0, Length: hdr.Size}}
		if m, ok := hdr.PAXRecords[paxSparseMap]; ok {
			size, err := strconv.ParseInt(hdr.PAXRecords[paxSparseSize], 10, 64)
			if err == nil {
				err = json.Unmarshal([]byte(m), &segments)
			}
			if err == nil {
				err = f.Truncate(size)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range segments {
			if _, err := io.CopyN(io.NewOffsetWriter(f, s.Offset), tr, s.Length); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, hdr.ModTime, hdr.ModTime); err != nil {
			t.Fatal(err)
		}
	}
}

// Settings of snapshot.json the artifact cannot carry are named, not lost silently.
func TestPushNamesUncarriedSettings(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	path := writeFile(t, "snap.tar", snapshotArchive(t, testimage.SnapshotOptions{Name: "snap", SharedMemory: true}), false)
	res, err := Push(context.Background(), path, reg.ref("shared/snap:v1"), PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Uncarried, []string{"shared_memory"}) {
		t.Fatalf("uncarried %v", res.Uncarried)
	}
}

// snapshotDirOf makes a directory of the test holding files, by name and content.
func snapshotDirOf(t *testing.T, files map[string]string) string {
	t.Helper()
	return snapshotDirIn(t, t.TempDir(), "snap", files)
}

// snapshotDirIn makes the directory parent/name holding files, by name and content.
func snapshotDirIn(t *testing.T, parent, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(parent, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// podJSON is a pod checkpoint's PodFile with these containers.
func podJSON(containers string) string {
	return `{"version":1,"pod":{"name":"web","namespace":"default"},"containers":` + containers + `}`
}

// tarEntry is one entry of a hand-made archive.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func tarOf(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Whatever is wrong with the reference or the archive is said before the registry is reached:
// nothing is pushed.
func TestPushRefusals(t *testing.T) {
	// A registry that must not be reached.
	var mu sync.Mutex
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/refused/snap:v1"

	snapshotJSON := tarEntry{hdr: tar.Header{Name: "snapshot.json"}, body: `{"config":{"name":"snap","cpu":1},"version":1}`}
	file := func(name, body string) tarEntry { return tarEntry{hdr: tar.Header{Name: name}, body: body} }
	good := tarOf(t, snapshotJSON, file("config.json", "{}"))
	// snapshot.json's header and block, config.json's header and one byte of its body.
	truncated := good[:3*512+1]
	badMetadata := tarOf(t, file(checkpoint.MetadataName, `{"version":7}`), snapshotJSON)

	cases := map[string]struct {
		path func(t *testing.T) string
		ref  string
		want string
	}{
		"missing file":    {path: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.tar") }, want: "no such file"},
		"empty directory": {path: func(t *testing.T) string { return t.TempDir() }, want: "not a cocoon snapshot directory"},
		"directory, old snapshot.json": {path: func(t *testing.T) string {
			return snapshotDirOf(t, map[string]string{"snapshot.json": `{"config":{"name":"snap"},"version":9}`})
		}, want: "has version 9"},
		"directory with a directory": {path: func(t *testing.T) string {
			dir := snapshotDirOf(t, map[string]string{"snapshot.json": snapshotJSON.body})
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
				t.Fatal(err)
			}
			return dir
		}, want: "sub is not a regular file"},
		"directory with a symlink": {path: func(t *testing.T) string {
			dir := snapshotDirOf(t, map[string]string{"snapshot.json": snapshotJSON.body})
			if err := os.Symlink("/etc/passwd", filepath.Join(dir, "cow.raw")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, want: "cow.raw is not a regular file"},
		"a pod checkpoint": {path: func(t *testing.T) string {
			return snapshotDirOf(t, map[string]string{checkpoint.PodFile: podJSON(`[{"name":"app","snapshot":"c1"},{"name":"side","archive":"c2.tar"}]`)})
		}, want: "/c1 (container app), "},
		"a pod checkpoint naming an entry outside it": {path: func(t *testing.T) string {
			return snapshotDirOf(t, map[string]string{checkpoint.PodFile: podJSON(`[{"name":"app","snapshot":"../c1"}]`)})
		}, want: `container "app" names no entry of the directory`},
		"an unreadable pod.json": {path: func(t *testing.T) string {
			return snapshotDirOf(t, map[string]string{checkpoint.PodFile: "junk"})
		}, want: "is not a cocoon-cri pod checkpoint of version 1"},
		"a directory its pod checkpoint does not name": {path: func(t *testing.T) string {
			pod := snapshotDirOf(t, map[string]string{checkpoint.PodFile: podJSON(`[{"name":"app","snapshot":"c1"}]`)})
			return snapshotDirIn(t, pod, "c2", map[string]string{"snapshot.json": snapshotJSON.body})
		}, want: "does not hold this directory"},
		"a container's directory without metadata": {path: func(t *testing.T) string {
			pod := snapshotDirOf(t, map[string]string{checkpoint.PodFile: podJSON(`[{"name":"app","snapshot":"c1"}]`)})
			return snapshotDirIn(t, pod, "c1", map[string]string{"snapshot.json": snapshotJSON.body})
		}, want: `no checkpoint metadata of version 1 for container "app"`},
		"empty file":                {path: func(t *testing.T) string { return writeFile(t, "a", nil, false) }, want: "no snapshot.json"},
		"not a tar":                 {path: func(t *testing.T) string { return writeFile(t, "a", []byte(strings.Repeat("x", 2048)), false) }, want: "not a cocoon snapshot archive"},
		"qcow2":                     {path: func(t *testing.T) string { return writeFile(t, "a", qcow2Disk(t), true) }, want: "qcow2"},
		"tar without snapshot.json": {path: func(t *testing.T) string { return writeFile(t, "a", tarOf(t, file("config.json", "{}")), false) }, want: "not snapshot.json"},
		"snapshot.json not first": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, file("config.json", "{}"), snapshotJSON), false)
		}, want: "not snapshot.json"},
		"snapshot.json of another version": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, tarEntry{hdr: tar.Header{Name: "snapshot.json"}, body: `{"config":{},"version":2}`}), false)
		}, want: "version 2"},
		"snapshot.json not JSON": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, tarEntry{hdr: tar.Header{Name: "snapshot.json"}, body: `{`}), false)
		}, want: "read snapshot.json"},
		"a directory entry": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, tarEntry{hdr: tar.Header{Name: "disks/", Typeflag: tar.TypeDir, Mode: 0o755}}), false)
		}, want: "not a regular file"},
		"a symlink": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, tarEntry{hdr: tar.Header{Name: "cow.raw", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}}), false)
		}, want: "not a regular file"},
		"a path": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, file("../cow.raw", "x")), false)
		}, want: "not a plain file name"},
		"a file twice": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, file("a", "1"), file("a", "2")), false)
		}, want: "has a twice"},
		"snapshot.json twice": {path: func(t *testing.T) string { return writeFile(t, "a", tarOf(t, snapshotJSON, snapshotJSON), false) }, want: "snapshot.json twice"},
		"sparse map without size": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, tarEntry{hdr: tar.Header{Name: "cow.raw", PAXRecords: map[string]string{paxSparseMap: `[{"o":0,"l":1}]`}}, body: "x"}), false)
		}, want: "only one of"},
		"bad sparse size": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, tarEntry{hdr: tar.Header{Name: "cow.raw", PAXRecords: map[string]string{paxSparseMap: `[{"o":0,"l":1}]`, paxSparseSize: "big"}}, body: "x"}), false)
		}, want: "sparse records"},
		"an unknown cocoon record": {path: func(t *testing.T) string {
			return writeFile(t, "a", tarOf(t, snapshotJSON, tarEntry{hdr: tar.Header{Name: "cow.raw", PAXRecords: map[string]string{"COCOON.xattr": "1"}}, body: "x"}), false)
		}, want: "COCOON.xattr"},
		"truncated":              {path: func(t *testing.T) string { return writeFile(t, "a", truncated, false) }, want: "config.json"},
		"truncated gzip":         {path: func(t *testing.T) string { return writeFile(t, "a", truncated, true) }, want: "config.json"},
		"bad checkpoint":         {path: func(t *testing.T) string { return writeFile(t, "a", badMetadata, false) }, want: "metadata version 7"},
		"bad reference":          {ref: strings.TrimPrefix(srv.URL, "http://") + "/Refused/Snap:v1", want: "image reference"},
		"reference by digest":    {ref: strings.TrimPrefix(srv.URL, "http://") + "/refused/snap@sha256:" + strings.Repeat("a", 64), want: "names a digest"},
		"reference without repo": {ref: "", want: "image reference"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, "good.tar", good, false)
			if tc.path != nil {
				path = tc.path(t)
			}
			r := ref
			if tc.path == nil {
				r = tc.ref
			}
			_, err := Push(context.Background(), path, r, PushOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Push = %v, want an error saying %q", err, tc.want)
			}
			if name != "missing file" && !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v is not ErrInvalid", err)
			}
			if name == "missing file" && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%v is not ErrNotExist", err)
			}
		})
	}
	if _, err := Push(context.Background(), writeFile(t, "good.tar", good, false), ref, PushOptions{Insecure: []string{"a/b"}}); err == nil {
		t.Fatal("a bad insecure registry was taken")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(requests) != 0 {
		t.Fatalf("the registry was reached: %v", requests)
	}
}

// A registry that wants credentials gets those given, or else the docker config's for that
// registry; another registry's are never sent.
func TestPushCredentials(t *testing.T) {
	reg := newTestRegistry(t, "pusher", "s3cret")
	ctx := context.Background()
	path := writeFile(t, "snap.tar", snapshotArchive(t, testimage.SnapshotOptions{Name: "snap"}), false)

	if _, err := Push(ctx, path, reg.ref("private/snap:v1"), PushOptions{}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("anonymous push: %v, want ErrUnauthenticated", err)
	}
	if _, err := Push(ctx, path, reg.ref("private/snap:v1"), PushOptions{Credentials: Credentials{Username: "pusher", Password: "wrong"}}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("wrong password: %v, want ErrUnauthenticated", err)
	}
	if _, err := Push(ctx, path, reg.ref("private/snap:v1"), PushOptions{Credentials: Credentials{Username: "pusher", Password: "s3cret"}}); err != nil {
		t.Fatal(err)
	}

	// The docker config: an entry for another registry is not used, one for this registry is.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", filepath.Join(home, ".docker"))
	writeDockerConfig := func(host string) {
		t.Helper()
		auth := base64.StdEncoding.EncodeToString([]byte("pusher:s3cret"))
		data := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
		if err := os.MkdirAll(filepath.Join(home, ".docker"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, ".docker", "config.json"), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeDockerConfig("other.example:5000")
	if _, err := Push(ctx, path, reg.ref("private/snap:v2"), PushOptions{Keychain: authn.DefaultKeychain}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("with another registry's credentials: %v, want ErrUnauthenticated", err)
	}
	writeDockerConfig(reg.Host)
	res, err := Push(ctx, path, reg.ref("private/snap:v2"), PushOptions{Keychain: authn.DefaultKeychain})
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t, PullOptions{})
	if img, err := n.svc.Pull(ctx, res.Ref, Credentials{Username: "pusher", Password: "s3cret"}); err != nil || img.ID != res.Digest {
		t.Fatalf("pull: %+v, %v", img, err)
	}
}

// A gzipped archive's files can be read again in any order and at once, as retried uploads do.
func TestArchiveSourceEntries(t *testing.T) {
	original := snapshotArchive(t, testimage.SnapshotOptions{Name: "snap", ImageType: cocoon.ImageTypeCloudImg})
	for _, gzipped := range []bool{false, true} {
		src, err := openArchive(writeFile(t, "snap.tar", original, gzipped))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() }) //nolint:errcheck
		if src.gzipped != gzipped {
			t.Fatalf("gzipped %v, detected %v", gzipped, src.gzipped)
		}
		scan, err := scanArchive(src)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]byte{}
		tr := tar.NewReader(bytes.NewReader(original))
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			want[hdr.Name], _ = io.ReadAll(tr)
		}
		if len(scan.files) != len(want)-1 {
			t.Fatalf("%d files scanned, the archive has %d besides snapshot.json", len(scan.files), len(want)-1)
		}
		// Backwards, and each while the one before is still open.
		var open []io.ReadCloser
		for _, f := range slices.Backward(scan.files) {
			r, err := f.open()
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, r)
			got, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(got, want[f.name]) {
				t.Fatalf("gzip %v: %s read back as %d bytes (%v), want %d", gzipped, f.name, len(got), err, len(want[f.name]))
			}
		}
		for _, r := range open {
			r.Close() //nolint:errcheck
		}
		// Then in order, as a push reads them.
		for _, f := range scan.files {
			r, err := f.open()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			r.Close() //nolint:errcheck
			if err != nil || !bytes.Equal(got, want[f.name]) {
				t.Fatalf("gzip %v: %s read back in order as %d bytes (%v)", gzipped, f.name, len(got), err)
			}
		}
	}
}

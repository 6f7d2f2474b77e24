package cocoonsim_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

func TestPullCloudImageURL(t *testing.T) {
	s := newSim(t)
	var disk bytes.Buffer
	if err := testimage.WriteQCOW2(&disk, 1<<30); err != nil {
		t.Fatal(err)
	}
	var downloads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debian.qcow2" {
			http.NotFound(w, r)
			return
		}
		downloads.Add(1)
		_, _ = w.Write(disk.Bytes())
	}))
	defer srv.Close()
	url := srv.URL + "/debian.qcow2"

	r := s.cocoon("image", "pull", url)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "" {
		t.Fatalf("pull: exit %d, stdout %q, %s", r.code, r.stdout, stripANSI(r.stderr))
	}
	img := decode[cocoon.Image](t, s.ok("image", "inspect", url))
	if img.Type != cocoon.ImageTypeCloudImg || img.Name != url || img.Size != int64(disk.Len()) {
		t.Fatalf("inspect: %+v", img)
	}
	s.ok("image", "pull", url)
	if downloads.Load() != 1 {
		t.Fatalf("a second pull of a present URL downloaded again (%d downloads)", downloads.Load())
	}
	s.ok("image", "pull", "--force", url)
	if downloads.Load() != 2 {
		t.Fatal("--force did not download again")
	}
	missing := srv.URL + "/missing.qcow2"
	s.fails("pull "+missing+": http get "+missing+": status 404 404 Not Found", "image", "pull", missing)
}

// TestPullOCIImage: a registry reference is fetched with go-containerregistry (plain HTTP for
// loopback, credentials from the docker config) and its layers go through mkfs.erofs, so where
// mkfs.erofs cannot read tars (Debian 12) the pull fails as cocoon's does and stores nothing.
func TestPullOCIImage(t *testing.T) {
	s := newSim(t)
	target := registry.StartInProcess(t, "puller", "s3cret")
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{}); err != nil {
		t.Fatal(err)
	}
	pushed, err := target.PushOCIImage(context.Background(), "vm/app:v1", layer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ref := pushed.Ref

	r := s.cocoon("image", "pull", ref)
	if r.code != 1 || !strings.Contains(r.errorLine(), "Error: pull "+ref+": fetch image "+ref+": ") || !strings.Contains(r.errorLine(), "UNAUTHORIZED") {
		t.Fatalf("pull without credentials: exit %d, %q", r.code, r.errorLine())
	}
	creds := dockerConfig(t, target.Host, "puller", "s3cret")
	r = s.cocoonIn(append(withoutTools(t), creds), nil, "image", "pull", ref)
	if !strings.HasPrefix(r.errorLine(), "Error: pull "+ref+": process layers: start erofs conversion: start mkfs.erofs: ") {
		t.Fatalf("pull without mkfs.erofs: %q", r.errorLine())
	}
	requireTool(t, "mkfs.erofs")
	r = s.cocoonIn([]string{creds}, nil, "image", "pull", ref)
	if !erofsHasTar() {
		if r.code != 1 || !strings.HasPrefix(r.errorLine(), "Error: pull "+ref+": process layers: mkfs.erofs failed: ") {
			t.Fatalf("pull with a mkfs.erofs without --tar: exit %d, %q", r.code, r.errorLine())
		}
		if got := s.ok("image", "list"); got != "No images found.\n" {
			t.Fatalf("a failed pull stored %q", got)
		}
		t.Skip("mkfs.erofs has no --tar: only the failure path was tested")
	}
	if r.code != 0 {
		t.Fatalf("pull: %s", stripANSI(r.stderr))
	}
	img := decode[cocoon.Image](t, s.ok("image", "inspect", ref))
	if img.ID != pushed.Digest || img.Type != cocoon.ImageTypeOCI || img.Name != ref {
		t.Fatalf("inspect: %+v (pushed %s)", img, pushed.Digest)
	}
	s.cocoonIn([]string{creds}, nil, "image", "pull", ref)
	if list := decode[[]cocoon.Image](t, s.ok("image", "list", "-o", "json")); len(list) != 1 {
		t.Fatalf("a second pull added an image: %+v", list)
	}
}

// dockerConfig writes a docker config with credentials for host and returns its DOCKER_CONFIG.
func dockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return "DOCKER_CONFIG=" + dir
}

// TestClonePullFetchesAMissingBase: vm clone --pull looks the snapshot's base image up by its
// recorded digest and, missing, pulls the recorded reference pinned to that digest, as cocoon's
// core.EnsureImage. A failed pull only warns, and the clone's check of the base files decides:
// here they are installed, so the clone runs. Without --pull nothing is fetched.
func TestClonePullFetchesAMissingBase(t *testing.T) {
	s := newSim(t)
	target := registry.StartInProcess(t, "", "")
	opts := s.importSnapshot(testimage.SnapshotOptions{Name: "moved", Image: target.Host + "/vm/base:v1"})
	snap := decode[cocoon.Snapshot](t, s.ok("snapshot", "inspect", "moved"))
	pinned := target.Host + "/vm/base@" + snap.ImageDigest
	if snap.Image != opts.Image || !strings.HasPrefix(snap.ImageDigest, "sha256:") {
		t.Fatalf("snapshot records base %q at %q", snap.Image, snap.ImageDigest)
	}

	r := s.cocoon("vm", "clone", "--name", "pulled", "--pull", "moved")
	log := stripANSI(r.stderr)
	if r.code != 0 || !strings.Contains(log, "base image not found locally, pulling "+pinned) ||
		!strings.Contains(log, "auto-pull "+pinned+" failed (imported image?): fetch image "+pinned) {
		t.Fatalf("clone --pull of a snapshot whose base the registry lacks: exit %d\n%s", r.code, log)
	}
	if r := s.cocoon("vm", "clone", "--name", "plain", "moved"); r.code != 0 || strings.Contains(r.stderr, "pulling") {
		t.Fatalf("clone without --pull: exit %d\n%s", r.code, stripANSI(r.stderr))
	}
}

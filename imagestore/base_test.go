package imagestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// TestSnapshotBasesComeWithThePull: a snapshot whose base image the node lacks brings it along,
// pinned to the digest the snapshot records and with the pull's credentials; a base that cannot be
// had fails the pull (or the import) naming it, and leaves nothing; a base that names no
// registry is left to the clone.
func TestSnapshotBasesComeWithThePull(t *testing.T) {
	reg := newTestRegistry(t, "puller", "s3cret")
	creds := Credentials{Username: "puller", Password: "s3cret"}
	n := newTestNode(t, PullOptions{})
	ctx := context.Background()
	target := reg.direct
	push := func(repoTag string, opts testimage.SnapshotOptions) {
		t.Helper()
		if _, err := target.PushSnapshot(ctx, repoTag, bytes.NewReader(snapshotArchive(t, opts)), registry.SnapshotPush{}); err != nil {
			t.Fatal(err)
		}
	}

	// A base the registry does not have: the pull fails, naming it, and nothing is left.
	missing := reg.ref("vm/missing:v1")
	push("snap/orphan:v1", testimage.SnapshotOptions{Name: "orphan", Image: missing})
	_, err := n.svc.Pull(ctx, reg.ref("snap/orphan:v1"), creds)
	if !errors.Is(err, ErrBaseUnavailable) || !strings.Contains(err.Error(), reg.ref("vm/missing@sha256:")) {
		t.Fatalf("pull of a snapshot whose base is nowhere: %v", err)
	}
	n.assertEmpty()
	// The same archive imported: the same refusal.
	archive := snapshotArchive(t, testimage.SnapshotOptions{Name: "orphan", Image: missing})
	if _, err := n.svc.Import(ctx, "e2e/orphan:v1", fmt.Sprintf("sha256:%x", sha256.Sum256(archive)), bytes.NewReader(archive)); !errors.Is(err, ErrBaseUnavailable) {
		t.Fatalf("import of a snapshot whose base is nowhere: %v", err)
	}
	n.assertEmpty()

	// A base that names no registry (the default, an imported image's name) is not looked for.
	push("snap/local:v1", testimage.SnapshotOptions{Name: "local"})
	if img, err := n.svc.Pull(ctx, reg.ref("snap/local:v1"), creds); err != nil || img.Snapshot.BaseImage != testimage.DefaultBaseImage {
		t.Fatalf("pull of a snapshot of a local base: %+v, %v", img, err)
	}

	// A base in the registry comes with the pull, by the recorded digest.
	if out, _ := exec.Command("mkfs.erofs", "--help").CombinedOutput(); !strings.Contains(string(out), "--tar") {
		t.Skip("mkfs.erofs has no --tar: cocoon cannot pull an OCI base here (make setup builds one)")
	}
	var layer bytes.Buffer
	if err := testimage.WriteOCILayer(&layer, testimage.LayerOptions{}); err != nil {
		t.Fatal(err)
	}
	base, err := target.PushOCIImage(ctx, "vm/base:v1", layer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	push("snap/moved:v1", testimage.SnapshotOptions{Name: "moved", Image: reg.ref("vm/base:v1"), ImageDigest: base.Digest})
	img, err := n.svc.Pull(ctx, reg.ref("snap/moved:v1"), creds)
	if err != nil || img.Kind != store.ImageSnapshot || img.Snapshot.BaseDigest != base.Digest {
		t.Fatalf("pull of a snapshot whose base is in the registry: %+v, %v", img, err)
	}
	got, err := n.cocoon.ImageInspect(ctx, base.Digest)
	if err != nil || got.Name != reg.ref("vm/base@"+base.Digest) {
		t.Fatalf("the base in cocoon: %+v, %v", got, err)
	}
}

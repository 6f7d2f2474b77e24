package imagestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/test/registry"
)

func TestPullSnapshotByTagAndByDigest(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	pushed := reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	ctx := context.Background()

	img, err := n.svc.Pull(ctx, reg.ref("team/snap:v1"), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	digestRef := reg.ref("team/snap@" + pushed.Digest)
	if img.ID != pushed.Digest || img.Kind != store.ImageSnapshot || img.LocalName != LocalName(pushed.Digest) {
		t.Fatalf("image %+v, pushed %s", img, pushed.Digest)
	}
	if !slices.Equal(img.RepoTags, []string{reg.ref("team/snap:v1")}) || !slices.Equal(img.RepoDigests, []string{digestRef}) {
		t.Fatalf("references: %v %v", img.RepoTags, img.RepoDigests)
	}
	if img.Snapshot == nil || img.Snapshot.CPU != 1 || img.Snapshot.Memory != 512<<20 {
		t.Fatalf("snapshot description %+v", img.Snapshot)
	}
	snaps, err := n.cocoon.SnapshotList(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].Name != img.LocalName {
		t.Fatalf("cocoon snapshots %+v, %v", snaps, err)
	}

	// By digest: the same image and artifact.
	byDigest, err := n.svc.Pull(ctx, digestRef, Credentials{})
	if err != nil || byDigest.ID != img.ID {
		t.Fatalf("pull by digest: %+v, %v", byDigest, err)
	}
	if snaps, _ := n.cocoon.SnapshotList(ctx); len(snaps) != 1 {
		t.Fatalf("a second artifact for one digest: %+v", snaps)
	}
	if got, err := n.svc.Get(digestRef); err != nil || got.ID != img.ID {
		t.Fatalf("lookup by digest reference: %v", err)
	}
}

func TestTwoTagsOfOneDigestShareOneArtifact(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	a := reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	ctx := context.Background()
	first, err := n.svc.Pull(ctx, reg.ref("team/snap:v1"), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	// The same manifest under another tag.
	if err := reg.direct.Tag(ctx, a, "stable"); err != nil {
		t.Fatal(err)
	}
	requests := reg.proxy.BlobRequests(a.Blobs["memory-range-0"])
	second, err := n.svc.Pull(ctx, reg.ref("team/snap:stable"), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID || len(second.RepoTags) != 2 {
		t.Fatalf("second tag: %+v", second)
	}
	if reg.proxy.BlobRequests(a.Blobs["memory-range-0"]) != requests {
		t.Fatal("the second tag downloaded the blobs again")
	}
	if snaps, _ := n.cocoon.SnapshotList(ctx); len(snaps) != 1 {
		t.Fatalf("cocoon snapshots: %+v", snaps)
	}
}

func TestPullCloudImage(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	disk := qcow2Disk(t)
	pushed, err := reg.direct.PushCloudImage(context.Background(), "os/debian:12", disk, 3)
	if err != nil {
		t.Fatal(err)
	}
	img, err := n.svc.Pull(context.Background(), reg.ref("os/debian:12"), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != pushed.Digest || img.Kind != store.ImageCloud || img.Size != int64(len(disk)) {
		t.Fatalf("image %+v", img)
	}
	imgs, err := n.cocoon.ImageList(context.Background())
	if err != nil || len(imgs) != 1 || imgs[0].Name != img.LocalName || imgs[0].Type != "cloudimg" {
		t.Fatalf("cocoon images %+v, %v", imgs, err)
	}
}

func TestPullIndexPicksThisPlatform(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	ctx := context.Background()
	arm, err := reg.direct.PushCloudImage(ctx, "multi/app:arm64", qcow2Disk(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	amd := reg.pushSnapshot(t, "multi/app:amd64", registry.SnapshotPush{})
	index, err := reg.direct.PushIndex(ctx, "multi/app:v1",
		registry.IndexEntry{OS: "linux", Architecture: "arm64", Digest: arm.Digest},
		registry.IndexEntry{OS: "linux", Architecture: "amd64", Digest: amd.Digest})
	if err != nil {
		t.Fatal(err)
	}
	img, err := n.svc.Pull(ctx, reg.ref("multi/app:v1"), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	if img.ID != amd.Digest || img.Kind != store.ImageSnapshot {
		t.Fatalf("index gave %s (%s), want the amd64 snapshot %s", img.ID, img.Kind, amd.Digest)
	}
	if !slices.Contains(img.RepoDigests, reg.ref("multi/app@"+index.Digest)) {
		t.Fatalf("the index digest is not a repo digest: %v", img.RepoDigests)
	}
}

func TestPullAuthentication(t *testing.T) {
	reg := newTestRegistry(t, "puller", "s3cret")
	n := newTestNode(t, PullOptions{})
	reg.pushSnapshot(t, "private/snap:v1", registry.SnapshotPush{})
	ctx := context.Background()
	for name, creds := range map[string]Credentials{
		"no credentials":    {},
		"wrong credentials": {Username: "puller", Password: "guess"},
	} {
		_, err := n.svc.Pull(ctx, reg.ref("private/snap:v1"), creds)
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), reg.Host) {
			t.Fatalf("%s: %v", name, err)
		}
		n.assertEmpty()
	}
	if _, err := n.svc.Pull(ctx, reg.ref("private/snap:v1"), Credentials{Username: "puller", Password: "s3cret"}); err != nil {
		t.Fatal(err)
	}
}

func TestPullOfWhatIsNotThere(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	cases := map[string]struct {
		ref  string
		want error
	}{
		"a missing tag":        {reg.ref("team/snap:v9"), ErrNotFound},
		"a missing repository": {reg.ref("team/nothing:v1"), ErrNotFound},
		"a bad reference":      {"Not A Reference", ErrInvalid},
		"a bad host":           {reg.ref("team/snap:v1:v2"), ErrInvalid},
		"an unreachable host":  {"127.0.0.1:1/team/snap:v1", ErrUnreachable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := n.svc.Pull(context.Background(), tc.ref, Credentials{}); !errors.Is(err, tc.want) {
				t.Fatalf("pull %s: %v, want %v", tc.ref, err, tc.want)
			}
			n.assertEmpty()
		})
	}
}

func TestConcurrentPullsOfOneReferenceDownloadOnce(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	pushed := reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	// Hold the download until every pull asked for the image.
	memory := pushed.Blobs["memory-range-0"]
	reg.proxy.Break(memory, registry.Fault{Kind: registry.Stall})
	const pulls = 6
	var wg sync.WaitGroup
	errs := make(chan error, pulls)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range pulls {
		wg.Go(func() {
			_, err := n.svc.Pull(ctx, reg.ref("team/snap:v1"), Credentials{})
			errs <- err
		})
	}
	<-reg.proxy.Stalls()
	waitForWaiters(t, &n.svc.pulls, n.flightKey(reg.ref("team/snap:v1")), pulls)
	cancel() // every caller leaves: the one download stops
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("pull: %v", err)
		}
	}
	if got := reg.proxy.BlobRequests(memory); got != 1 {
		t.Fatalf("%d concurrent pulls downloaded the blob %d times", pulls, got)
	}
	n.assertEmpty()
}

// TestPullsOfDifferentImagesRunInParallel: one pull that hangs does not hold up another.
func TestPullsOfDifferentImagesRunInParallel(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	stuck := reg.pushSnapshot(t, "team/stuck:v1", registry.SnapshotPush{})
	ctx := context.Background()
	if _, err := reg.direct.PushCloudImage(ctx, "os/disk:v1", qcow2Disk(t), 2); err != nil {
		t.Fatal(err)
	}
	reg.proxy.Break(stuck.Blobs["memory-range-0"], registry.Fault{Kind: registry.Stall})
	stuckCtx, cancel := context.WithCancel(ctx)
	stuckDone := make(chan error, 1)
	go func() {
		_, err := n.svc.Pull(stuckCtx, reg.ref("team/stuck:v1"), Credentials{})
		stuckDone <- err
	}()
	<-reg.proxy.Stalls()
	if _, err := n.svc.Pull(ctx, reg.ref("os/disk:v1"), Credentials{}); err != nil {
		t.Fatalf("a pull waited for another image's: %v", err)
	}
	cancel()
	if err := <-stuckDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the stuck pull: %v", err)
	}
	if imgs := n.svc.List(""); len(imgs) != 1 || imgs[0].Kind != store.ImageCloud {
		t.Fatalf("images: %+v", imgs)
	}
	if snaps, _ := n.cocoon.SnapshotList(ctx); len(snaps) != 0 {
		t.Fatalf("the cancelled pull left %+v", snaps)
	}
}

func TestPullThatStallsFails(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{ProgressTimeout: 200 * time.Millisecond})
	pushed := reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	reg.proxy.Break(pushed.Blobs["memory-range-0"], registry.Fault{Kind: registry.Stall, After: 5})
	_, err := n.svc.Pull(context.Background(), reg.ref("team/snap:v1"), Credentials{})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "received nothing") {
		t.Fatalf("a stalled pull: %v", err)
	}
	n.assertEmpty()
}

func TestBrokenDownloadsAndImportsLeaveNothing(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	n := newTestNode(t, PullOptions{})
	cases := []struct {
		name  string
		fault registry.Fault
		files map[string]registry.FileRecord
		want  error
	}{
		{name: "a corrupt blob", fault: registry.Fault{Kind: registry.Corrupt, After: 3}, want: ErrCorrupt},
		{name: "a cut download", fault: registry.Fault{Kind: registry.Cut, After: 7}},
		{name: "an import cocoon fails", files: map[string]registry.FileRecord{"cow.raw": {Mode: 0o600, SparseMap: "not a map", SparseSize: 10 << 30}}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repoTag := fmt.Sprintf("broken/snap:v%d", i)
			pushed := reg.pushSnapshot(t, repoTag, registry.SnapshotPush{Files: tc.files})
			if tc.fault.Kind != 0 {
				reg.proxy.Break(pushed.Blobs["cow.raw"], tc.fault)
				defer reg.proxy.Heal()
			}
			_, err := n.svc.Pull(context.Background(), reg.ref(repoTag), Credentials{})
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("pull: %v, want %v", err, tc.want)
			}
			n.assertEmpty()
		})
	}
}

func TestPullReportsProgress(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	var reports []PullProgress
	var mu sync.Mutex
	n := newTestNode(t, PullOptions{OnProgress: func(p PullProgress) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, p)
	}})
	reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	if _, err := n.svc.Pull(context.Background(), reg.ref("team/snap:v1"), Credentials{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	last := reports[len(reports)-1]
	if !last.Done || last.Bytes != last.Total || last.Total == 0 {
		t.Fatalf("last report %+v", last)
	}
}

// flightKey is the key an anonymous pull of ref flies under.
func (n *testNode) flightKey(ref string) string {
	normalized, err := Normalize(ref)
	if err != nil {
		n.t.Fatal(err)
	}
	return pullKey(normalized, Credentials{})
}

// OnPulled hears once about every pull that ended: what it was, whether it downloaded anything,
// and how it failed.
func TestPullTellsHowItEnded(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	var results []PullResult
	var mu sync.Mutex
	n := newTestNode(t, PullOptions{OnPulled: func(r PullResult) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
	}})
	last := func() PullResult {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(results) == 0 {
			t.Fatal("no pull reported")
		}
		r := results[len(results)-1]
		results = nil
		return r
	}
	ctx := context.Background()
	pushed := reg.pushSnapshot(t, "team/snap:v1", registry.SnapshotPush{})
	if _, err := n.svc.Pull(ctx, reg.ref("team/snap:v1"), Credentials{}); err != nil {
		t.Fatal(err)
	}
	if r := last(); r.Err != nil || r.Kind != store.ImageSnapshot || r.Present || r.Bytes == 0 || r.Ref != reg.ref("team/snap:v1") {
		t.Fatalf("a snapshot download: %+v", r)
	}

	if _, err := n.svc.Pull(ctx, reg.ref("team/snap@"+pushed.Digest), Credentials{}); err != nil {
		t.Fatal(err)
	}
	if r := last(); r.Err != nil || r.Kind != store.ImageSnapshot || !r.Present {
		t.Fatalf("a pull of a digest on the node: %+v", r)
	}

	if _, err := n.svc.Pull(ctx, reg.ref("team/snap:v9"), Credentials{}); err == nil {
		t.Fatal("a missing tag was pulled")
	}
	if r := last(); !errors.Is(r.Err, ErrNotFound) || r.Kind != "" {
		t.Fatalf("a pull of a missing tag: %+v", r)
	}

	broken := reg.pushSnapshot(t, "team/broken:v1", registry.SnapshotPush{})
	reg.proxy.Break(broken.Blobs["cow.raw"], registry.Fault{Kind: registry.Corrupt, After: 3})
	defer reg.proxy.Heal()
	if _, err := n.svc.Pull(ctx, reg.ref("team/broken:v1"), Credentials{}); err == nil {
		t.Fatal("a corrupt blob was pulled")
	}
	if r := last(); !errors.Is(r.Err, ErrCorrupt) || r.Kind != store.ImageSnapshot || r.Present {
		t.Fatalf("a pull that failed in the download: %+v", r)
	}
}

// Registry credentials handed to cocoon for its own pull live in the private directory under the
// state dir (0700), never in a shared temporary one, and only for the pull; what a crash left there
// is removed when the service starts.
func TestPullCredentialsStayPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pull-credentials")
	if err := os.MkdirAll(filepath.Join(dir, "pull-left-by-a-crash"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := newTestNode(t, PullOptions{CredentialsDir: dir})
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("the credentials directory at start: %v, %v", entries, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the credentials directory: %v, %v", fi.Mode(), err)
	}
	reg, _ := name.NewRegistry("registry.example")
	config, remove, err := dockerConfig(n.svc.pullOpts.CredentialsDir, reg, Credentials{Username: "puller", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(config) != dir {
		t.Fatalf("credentials written to %s, outside %s", config, dir)
	}
	if data, err := os.ReadFile(filepath.Join(config, "config.json")); err != nil || !strings.Contains(string(data), "registry.example") {
		t.Fatalf("config.json: %s, %v", data, err)
	}
	remove()
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("credentials left after the pull: %v", entries)
	}
}

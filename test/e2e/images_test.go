package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cocoonstack/cocoon-cri/cri/vmruntime"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// snapshots lists the simulator's snapshots.
func (n *node) snapshots() []cocoon.Snapshot { return cocoonList[cocoon.Snapshot](n, "snapshot") }

type imageList struct {
	Images []struct {
		ID       string   `json:"id"`
		RepoTags []string `json:"repoTags"`
	} `json:"images"`
}

func (n *node) images() imageList {
	n.t.Helper()
	var list imageList
	if err := json.Unmarshal([]byte(n.mustCrictl("images", "-o", "json")), &list); err != nil {
		n.t.Fatal(err)
	}
	return list
}

func TestImageReferencesShareOneArtifact(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	file := n.SnapshotImage("snap", testimage.SnapshotOptions{})
	idA := n.ImportImage("e2e/app:v1", file)
	idB := n.ImportImage("registry.local:5000/team/app:stable", file)
	if idA != idB || !strings.HasPrefix(idA, "sha256:") {
		t.Fatalf("two imports of one file: %s and %s", idA, idB)
	}
	list := n.images()
	if len(list.Images) != 1 || len(list.Images[0].RepoTags) != 2 {
		t.Fatalf("crictl images: %+v", list)
	}
	if snaps := n.snapshots(); len(snaps) != 1 || snaps[0].Name != "cri-sha256-"+strings.TrimPrefix(idA, "sha256:") {
		t.Fatalf("cocoon snapshots: %+v", snaps)
	}
	// crictl's short IDs and normalised names find it.
	for _, ref := range []string{idA[7:19], "docker.io/e2e/app:v1", "e2e/app:v1", idA} {
		if out := n.mustCrictl("inspecti", "-o", "json", ref); !strings.Contains(out, idA) {
			t.Fatalf("inspecti %s: %s", ref, out)
		}
	}

	n.mustCrictl("rmi", "e2e/app:v1")
	if list := n.images(); len(list.Images) != 1 || strings.Join(list.Images[0].RepoTags, ",") != "registry.local:5000/team/app:stable" {
		t.Fatalf("after removing one tag: %+v", list)
	}
	if len(n.snapshots()) != 1 {
		t.Fatal("the artifact went while a reference remained")
	}
	n.mustCrictl("rmi", "registry.local:5000/team/app:stable")
	if list := n.images(); len(list.Images) != 0 {
		t.Fatalf("after removing the last tag: %+v", list)
	}
	if snaps := n.snapshots(); len(snaps) != 0 {
		t.Fatalf("the artifact outlived its last reference: %+v", snaps)
	}
}

// TestRemovedImageStaysWhileAClonesNeedsIt: an on-demand clone reads the snapshot's memory, so the
// snapshot is kept until the container is removed.
func TestRemovedImageStaysWhileACloneNeedsIt(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	id := n.withSnapshot()
	_, ctrID, _ := n.runningPod("keep", snapRef)

	n.mustCrictl("rmi", id)
	if list := n.images(); len(list.Images) != 0 {
		t.Fatalf("the removed image is still listed: %+v", list)
	}
	if len(n.snapshots()) != 1 {
		t.Fatal("the snapshot was deleted under a running clone")
	}
	time.Sleep(1500 * time.Millisecond) // longer than the simulated guest's memory-file check
	if st := field(n.inspect("inspect", ctrID), "status", "state"); st != "CONTAINER_RUNNING" {
		t.Fatalf("container %v", st)
	}
	if !testproc.Running(n.vmPID(ctrID)) {
		t.Fatal("the clone died: its snapshot was taken away")
	}

	n.mustCrictl("rm", "--force", ctrID)
	if snaps := n.snapshots(); len(snaps) != 0 {
		t.Fatalf("the snapshot outlived its last user: %+v", snaps)
	}
}

// TestReimportBringsBackARemovedImage: an image removed while a container still holds its artifact
// comes back without a second import.
func TestReimportBringsBackARemovedImage(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	file := n.SnapshotImage("snap", testimage.SnapshotOptions{})
	id := n.ImportImage(snapRef, file)
	podFile := n.configFile("pod.json", n.podConfig("keep", "uid-k"))
	podID := n.mustCrictl("runp", "--runtime", "cocoon", podFile)
	n.mustCrictl("create", "--no-pull", podID, n.configFile("ctr.json", containerConfig("app", snapRef)), podFile)
	n.mustCrictl("rmi", snapRef)
	if again := n.ImportImage("e2e/again:v2", file); again != id {
		t.Fatalf("re-import gave %s, want %s", again, id)
	}
	if list := n.images(); len(list.Images) != 1 || list.Images[0].RepoTags[0] != "docker.io/e2e/again:v2" {
		t.Fatalf("images: %+v", list)
	}
	if len(n.snapshots()) != 1 {
		t.Fatal("the artifact was imported twice or lost")
	}
}

// importDirect streams r to the node's import service with a digest of the caller's choosing.
func (n *node) importDirect(ctx context.Context, ref, digest string, r io.Reader) error {
	conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = vmruntime.ImportImage(ctx, conn, ref, digest, r)
	return err
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestBadImportsLeaveNothing: a wrong digest, a file that is no image, a truncated archive and a
// cancelled upload all fail and leave no record and no cocoon artifact.
func TestBadImportsLeaveNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	good := n.SnapshotImage("snap", testimage.SnapshotOptions{})
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	truncated := n.WriteFile("truncated.tar", data[:len(data)/2])
	garbage := n.WriteFile("garbage.bin", []byte("this is not an image at all"))
	wrongDigest := "sha256:" + strings.Repeat("ab", 32)

	cases := []struct {
		name   string
		file   string
		digest string
		code   codes.Code
	}{
		{"digest mismatch", good, wrongDigest, codes.InvalidArgument},
		{"not an image", garbage, fileSHA(t, garbage), codes.InvalidArgument},
		{"truncated archive", truncated, fileSHA(t, truncated), codes.Internal},
		{"malformed digest", good, "md5:abc", codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Open(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = n.importDirect(context.Background(), "e2e/bad:v1", tc.digest, f)
			if status.Code(err) != tc.code {
				t.Fatalf("import: %v, want %s", err, tc.code)
			}
			n.assertNoImages()
		})
	}

	t.Run("cancelled upload", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		// Half the archive, then a stall: the client gives up while cocoon is reading.
		r := io.MultiReader(strings.NewReader(string(data[:len(data)/2])), stallReader{ctx})
		go func() {
			time.Sleep(500 * time.Millisecond)
			cancel()
		}()
		if err := n.importDirect(ctx, "e2e/bad:v1", fileSHA(t, good), r); err == nil {
			t.Fatal("a cancelled import succeeded")
		}
		deadline := time.Now().Add(30 * time.Second)
		for len(n.snapshots()) != 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		n.assertNoImages()
	})
}

// stallReader blocks until its context ends.
type stallReader struct{ ctx context.Context }

func (s stallReader) Read([]byte) (int, error) {
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

func (n *node) assertNoImages() {
	n.t.Helper()
	if list := n.images(); len(list.Images) != 0 {
		n.t.Fatalf("images recorded: %+v", list)
	}
	if snaps := n.snapshots(); len(snaps) != 0 {
		n.t.Fatalf("cocoon artifacts left: %+v", snaps)
	}
}

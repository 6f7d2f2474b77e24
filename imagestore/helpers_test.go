package imagestore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store/storetest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/registry"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// simulator is the cocoon simulator, built once for the package's tests.
var simulator string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "imagestore-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	simulator = filepath.Join(dir, "cocoon-sim")
	cmd := exec.Command("go", "build", "-o", simulator, "github.com/cocoonstack/cocoon-cri/test/cocoonsim/cmd/cocoon-sim")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the cocoon simulator: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// testNode is a Service on the simulator, with everything under a temporary directory.
type testNode struct {
	t      testing.TB
	svc    *Service
	cocoon *cocoon.Client
}

func newTestNode(t testing.TB, opts PullOptions) *testNode {
	t.Helper()
	dir := t.TempDir()
	st := storetest.Open(t)
	cc := cocoon.New(cocoon.Options{
		Binary: simulator, RootDir: filepath.Join(dir, "root"), RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "log"),
	})
	if opts.CredentialsDir == "" {
		opts.CredentialsDir = filepath.Join(dir, "state", "pull-credentials")
	}
	svc, err := New(st, cc, slog.New(slog.NewTextHandler(t.Output(), nil)), Dirs{Root: filepath.Join(dir, "root"), Run: filepath.Join(dir, "run")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{t: t, svc: svc, cocoon: cc}
}

// assertEmpty checks that the node records no image and cocoon holds no artifact.
func (n *testNode) assertEmpty() {
	n.t.Helper()
	if imgs := n.svc.List(""); len(imgs) != 0 {
		n.t.Fatalf("images recorded: %+v", imgs)
	}
	ctx := context.Background()
	snaps, err := n.cocoon.SnapshotList(ctx)
	if err != nil || len(snaps) != 0 {
		n.t.Fatalf("cocoon snapshots: %+v, %v", snaps, err)
	}
	imgs, err := n.cocoon.ImageList(ctx)
	if err != nil || len(imgs) != 0 {
		n.t.Fatalf("cocoon images: %+v, %v", imgs, err)
	}
}

// testRegistry is an in-process registry with the fault proxy in front: Host reaches it through
// the proxy.
type testRegistry struct {
	direct registry.Target
	proxy  *registry.Proxy
	// Host is the proxy's address, what pulls use.
	Host string
}

func newTestRegistry(t *testing.T, user, password string) *testRegistry {
	t.Helper()
	direct := registry.StartInProcess(t, user, password)
	proxy := registry.StartProxy(t, registry.Target{Host: direct.Host}, "")
	return &testRegistry{direct: direct, proxy: proxy, Host: proxy.Host}
}

// snapshotArchive is a small snapshot archive as cocoon exports it.
func snapshotArchive(t *testing.T, opts testimage.SnapshotOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&buf, opts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pushSnapshot pushes a small snapshot under repoTag.
func (r *testRegistry) pushSnapshot(t *testing.T, repoTag string, opts registry.SnapshotPush) registry.Pushed {
	t.Helper()
	pushed, err := r.direct.PushSnapshot(context.Background(), repoTag, bytes.NewReader(snapshotArchive(t, testimage.SnapshotOptions{Name: "snap"})), opts)
	if err != nil {
		t.Fatal(err)
	}
	return pushed
}

// qcow2Disk is a small qcow2 cloud image disk.
func qcow2Disk(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testimage.WriteQCOW2(&buf, 1<<30); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ref is a reference to repoTag through the proxy.
func (r *testRegistry) ref(repoTag string) string { return r.Host + "/" + repoTag }

// resolve resolves repoTag in the registry as a pull does.
func (r *testRegistry) resolve(t *testing.T, repoTag string) (*registrySession, *artifact) {
	t.Helper()
	rc, err := newRegistryClient(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := rc.parse(r.ref(repoTag))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	session, err := rc.connect(ctx, ref.Context(), Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	art, err := session.resolve(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	return session, art
}

// snapshotLayouts are the snapshots the format tests go through: each hypervisor and image type,
// a sparse COW disk, and a described snapshot with a guest file.
var snapshotLayouts = map[string]testimage.SnapshotOptions{
	"direct boot, sparse COW disk": {Name: "snap", ImageType: cocoon.ImageTypeOCI, NICs: 1},
	"cloud image, qcow2 overlay":   {Name: "snap", ImageType: cocoon.ImageTypeCloudImg},
	"firecracker":                  {Name: "snap", Hypervisor: cocoon.HypervisorFirecracker},
	"described, with a guest file": {Name: "snap", CPU: 2, Description: "a described snapshot", Guest: guest.Spec{IgnorePowerButton: true}},
}

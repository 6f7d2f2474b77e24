package vmruntime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// fakeNode is a node for the lifecycle tests: the real Runtime over a real store (bbolt in a
// temporary directory) and a real image service, with cocoon and the pod network in memory
// (fakeCocoon, fakeNetwork). Its clock moves 1 ms each time it is read, so durations the runtime
// measures are the same on every run.
type fakeNode struct {
	t      testing.TB
	dir    string
	cfg    Config
	cocoon *fakeCocoon
	net    *fakeNetwork
	st     *store.Store
	s      *Runtime
	stop   func() // shuts the current server down and closes its store
	clock  atomic.Int64
}

func newFakeNode(t testing.TB, cfg Config) *fakeNode {
	t.Helper()
	if cfg.Cgroups == nil {
		// Never the host's: a warm pool places its VMs whatever the pods ask.
		cfg.Cgroups = &fakeCgroups{}
	}
	n := &fakeNode{t: t, dir: t.TempDir(), cfg: cfg, cocoon: newFakeCocoon(), net: newFakeNetwork()}
	n.cocoon.plugin = n.net
	n.clock.Store(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	n.start()
	return n
}

func (n *fakeNode) now() time.Time { return time.Unix(0, n.clock.Add(int64(time.Millisecond))) }

// start opens the store and makes a server over it and the fakes, as the daemon does; Recover is
// the test's to call.
func (n *fakeNode) start() {
	n.t.Helper()
	st, err := store.Open(filepath.Join(n.dir, "state.db"))
	if err != nil {
		n.t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	images, err := imagestore.New(st, n.cocoon, log, imagestore.Dirs{Root: filepath.Join(n.dir, "root"), Run: filepath.Join(n.dir, "run")},
		imagestore.PullOptions{CredentialsDir: filepath.Join(n.dir, "pull-credentials")})
	if err != nil {
		n.t.Fatal(err)
	}
	s := New(n.cfg, log, st, n.cocoon, n.net, images)
	s.nowFunc = n.now
	var once sync.Once
	n.st, n.s = st, s
	n.stop = func() {
		once.Do(func() {
			settle(s)
			s.Shutdown()
			if err := st.Close(); err != nil {
				n.t.Error(err)
			}
		})
	}
	n.t.Cleanup(n.stop)
}

// restart stops the server (its VMs go on) and starts another over the same state, cocoon and
// network.
func (n *fakeNode) restart() {
	n.t.Helper()
	n.stop()
	n.start()
}

// settle waits until every running container's guest set-up, which StartContainer leaves to the
// background, is over: nothing the test looks at then changes behind it.
func settle(s *Runtime) {
	s.iosMu.Lock()
	var ios []*containerIO
	for id, cio := range s.ios {
		// A hibernated VM's set-up waits for its wake.
		if c, err := s.store.Containers.Get(id); err == nil && cio.resumeGuest != nil && c.VM.Hibernated() {
			continue
		}
		ios = append(ios, cio)
	}
	s.iosMu.Unlock()
	for _, cio := range ios {
		<-cio.setUp
	}
}

// The images the tests run.
const (
	snapshotRef = "cocoon.local/app:v1"
	cloudRef    = "cocoon.local/ubuntu:24.04"
)

// appSnapshot is a snapshot of a one-NIC cloud-hypervisor VM booted from a cloud image: cocoon
// stops its clones gracefully (not a direct boot).
func appSnapshot() cocoon.SnapshotConfig {
	return cocoon.SnapshotConfig{
		Config: cocoon.Config{CPU: 2, Memory: 1 << 30, Storage: 10 << 30, Image: "cocoon.local/base:v1", ImageType: cocoon.ImageTypeCloudImg},
		Name:   "app", Hypervisor: cocoon.HypervisorCloudHypervisor, NICs: 1,
	}
}

// importImage brings data in under ref through the image service, as cocoon-cri image import does.
func (n *fakeNode) importImage(ref string, data []byte) *store.Image {
	n.t.Helper()
	sum := sha256.Sum256(data)
	img, err := n.s.images.Import(context.Background(), ref, "sha256:"+hex.EncodeToString(sum[:]), bytes.NewReader(data))
	if err != nil {
		n.t.Fatal(err)
	}
	return img
}

func (n *fakeNode) importSnapshot(ref string, cfg cocoon.SnapshotConfig) *store.Image {
	return n.importImage(ref, fakeSnapshotArchive(cfg, "memory of "+ref))
}

func (n *fakeNode) importCloudImage(ref string) *store.Image {
	return n.importImage(ref, append(append([]byte(nil), qcow2Magic...), []byte(ref)...))
}

func podConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:  &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Hostname:  name,
		DnsConfig: &runtimeapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"default.svc.cluster.local"}},
	}
}

func containerConfig(name, image string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
	}
}

func (n *fakeNode) runPod(name string) string {
	n.t.Helper()
	resp, err := n.s.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: podConfig(name), RuntimeHandler: HandlerName})
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.GetPodSandboxId()
}

func (n *fakeNode) createContainer(sandboxID, name, image string) string {
	n.t.Helper()
	sb, err := n.st.Sandboxes.Get(sandboxID)
	if err != nil {
		n.t.Fatal(err)
	}
	resp, err := n.s.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID, Config: containerConfig(name, image), SandboxConfig: sb.Config.Msg,
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return resp.GetContainerId()
}

func (n *fakeNode) startContainer(id string) {
	n.t.Helper()
	if _, err := n.s.StartContainer(context.Background(), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		n.t.Fatal(err)
	}
}

// runningPod is a pod whose one container, cloned from the app snapshot, runs.
func (n *fakeNode) runningPod(name string) (sandboxID, containerID string) {
	n.t.Helper()
	if _, err := n.s.images.Get(snapshotRef); err != nil {
		n.importSnapshot(snapshotRef, appSnapshot())
	}
	sandboxID = n.runPod(name)
	containerID = n.createContainer(sandboxID, "app", snapshotRef)
	n.startContainer(containerID)
	return sandboxID, containerID
}

func (n *fakeNode) container(id string) *store.Container {
	n.t.Helper()
	c, err := n.st.Containers.Get(id)
	if err != nil {
		n.t.Fatal(err)
	}
	return c
}

func (n *fakeNode) sandbox(id string) *store.Sandbox {
	n.t.Helper()
	sb, err := n.st.Sandboxes.Get(id)
	if err != nil {
		n.t.Fatal(err)
	}
	return sb
}

// wantCode fails the test unless err carries the gRPC code.
func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if grpcerr.Code(err) != code {
		t.Fatalf("error %v, want %s", err, code)
	}
}

// wantCalls fails the test unless got, a fake's calls, are want.
func wantCalls(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: calls %q, want %q", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: calls %q, want %q", what, got, want)
		}
	}
}

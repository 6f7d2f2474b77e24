package passthrough

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

// Both services, checked at compile time: the edge takes the passthrough runtime as a backend.
var (
	_ runtimeapi.RuntimeServiceServer = (*Runtime)(nil)
	_ runtimeapi.ImageServiceServer   = (*Runtime)(nil)
)

// peer is the other runtime: a CRI server on a unix socket that keeps what it was sent.
type peer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	mu       sync.Mutex
	got      *runtimeapi.RunPodSandboxRequest
	deadline time.Time
}

func (p *peer) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = req
	p.deadline, _ = ctx.Deadline()
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "from-peer"}, nil
}

func (p *peer) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", req.GetPodSandboxId())
}

func (p *peer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "peer"}, nil
}

func (p *peer) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	for _, id := range []string{"a", "b", "c"} {
		if err := stream.Send(&runtimeapi.ContainerEventResponse{ContainerId: id}); err != nil {
			return err
		}
	}
	return nil
}

func (p *peer) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: []*runtimeapi.Image{{Id: "sha256:peer"}}}, nil
}

// servePeer serves p on socket until the returned stop is called (the test's cleanup calls it too).
func servePeer(t *testing.T, p *peer, socket string) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, p)
	runtimeapi.RegisterImageServiceServer(g, p)
	done := make(chan struct{})
	go func() {
		_ = g.Serve(lis)
		close(done)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			g.Stop()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func socketPath(t *testing.T) string {
	t.Helper()
	// Not t.TempDir: a unix socket path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "pt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "cri.sock")
}

func dial(t *testing.T, endpoint string) *Runtime {
	t.Helper()
	r, err := Dial(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestRequestsAndAnswersPassUnchanged(t *testing.T) {
	p := &peer{}
	socket := socketPath(t)
	servePeer(t, p, socket)
	r := dial(t, "unix://"+socket)

	req := &runtimeapi.RunPodSandboxRequest{
		Config: &runtimeapi.PodSandboxConfig{
			Metadata:    &runtimeapi.PodSandboxMetadata{Name: "kube-proxy-x", Namespace: "kube-system", Uid: "u1"},
			Annotations: map[string]string{"a": "b"},
			Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		},
		RuntimeHandler: "runc",
	}
	deadline := time.Now().Add(time.Minute)
	cctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := r.RunPodSandbox(cctx, req)
	if err != nil || resp.GetPodSandboxId() != "from-peer" {
		t.Fatalf("RunPodSandbox: %v %v", resp, err)
	}
	p.mu.Lock()
	got, gotDeadline := p.got, p.deadline
	p.mu.Unlock()
	if !proto.Equal(got, req) {
		t.Fatalf("the peer got %v, want %v", got, req)
	}
	// gRPC sends the remaining time, rounded, so the peer's deadline is the caller's give or take
	// a moment; without it the peer would have none.
	if gotDeadline.IsZero() || gotDeadline.Sub(deadline).Abs() > 10*time.Second {
		t.Fatalf("the peer's deadline %v, the caller's %v", gotDeadline, deadline)
	}

	// The peer's NotFound comes back as it is.
	_, err = r.PodSandboxStatus(context.Background(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "x"})
	if status.Code(err) != codes.NotFound || status.Convert(err).Message() != `an error occurred when try to find sandbox "x": not found` {
		t.Fatalf("NotFound changed on the way: %v", err)
	}
	// So does Unimplemented, for the edge to tell a runtime that lacks a call.
	if _, err := r.RuntimeConfig(context.Background(), &runtimeapi.RuntimeConfigRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("RuntimeConfig of a peer without it: %v", err)
	}
}

// eventSink is a server stream that keeps what is sent to it.
type eventSink struct {
	grpc.ServerStream
	sent []string
}

func (s *eventSink) Context() context.Context { return context.Background() }
func (s *eventSink) Send(ev *runtimeapi.ContainerEventResponse) error {
	s.sent = append(s.sent, ev.GetContainerId())
	return nil
}

func TestStreamsAreRelayedToTheirEnd(t *testing.T) {
	socket := socketPath(t)
	servePeer(t, &peer{}, socket)
	r := dial(t, socket)
	sink := &eventSink{}
	if err := r.GetContainerEvents(&runtimeapi.GetEventsRequest{}, sink); err != nil {
		t.Fatal(err)
	}
	if strings.Join(sink.sent, ",") != "a,b,c" {
		t.Fatalf("relayed %v", sink.sent)
	}
}

func TestARuntimeThatIsDownIsNamedAndReachedAgain(t *testing.T) {
	p := &peer{}
	socket := socketPath(t)
	stop := servePeer(t, p, socket)
	endpoint := "unix://" + socket
	r := dial(t, endpoint)
	if _, err := r.Version(context.Background(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}

	stop()
	_ = os.Remove(socket)
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := r.Version(cctx, &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "passthrough runtime "+endpoint+" is unavailable") {
		t.Fatalf("a call to a stopped runtime: %v, want Unavailable naming it", err)
	}
	if _, err := r.ListImages(cctx, &runtimeapi.ListImagesRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("image service of a stopped runtime: %v", err)
	}

	// Back on the same socket: the connection comes back by itself.
	servePeer(t, p, socket)
	for {
		_, err := r.Version(cctx, &runtimeapi.VersionRequest{})
		if err == nil {
			break
		}
		if cctx.Err() != nil {
			t.Fatalf("not reconnected within a minute: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestEndpointsMustBeUnixSockets(t *testing.T) {
	for _, bad := range []string{"tcp://127.0.0.1:1234", "relative/containerd.sock", "unix://relative.sock", "npipe:////./pipe/containerd"} {
		if _, err := Dial(bad); err == nil || !strings.Contains(err.Error(), "unix") {
			t.Errorf("Dial(%q): %v, want a refusal that says what is accepted", bad, err)
		}
	}
	for _, good := range []string{"unix:///run/containerd/containerd.sock", "/run/containerd/containerd.sock"} {
		r, err := Dial(good)
		if err != nil {
			t.Errorf("Dial(%q): %v", good, err)
			continue
		}
		_ = r.Close()
	}
}

// A call to the peer is time its RPC waited: what passing through costs is the rest.
func TestCallsToThePeerAreWaits(t *testing.T) {
	socket := socketPath(t)
	servePeer(t, &peer{}, socket)
	r := dial(t, "unix://"+socket)
	cctx, account := waittime.New(context.Background())
	if _, err := r.RunPodSandbox(cctx, &runtimeapi.RunPodSandboxRequest{}); err != nil {
		t.Fatal(err)
	}
	if waited := account.Close(); waited <= 0 {
		t.Fatalf("a call through to the peer waited %v", waited)
	}
}

package cri

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/waittime"
)

var ctx = context.Background()

func runPod(t *testing.T, r *Router, name, handler string) string {
	t.Helper()
	resp, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{
		Config:         &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: name}},
		RuntimeHandler: handler,
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetPodSandboxId()
}

func wantCalls(t *testing.T, f interface{ got() []string }, want ...string) {
	t.Helper()
	if got := f.got(); !slices.Equal(got, want) {
		t.Fatalf("calls: got %q, want %q", got, want)
	}
}

func TestRunPodSandboxGoesByHandler(t *testing.T) {
	r, vm, pass := newRouter(false)
	for handler, want := range map[string]string{"cocoon": "cocoon", "": "containerd", "runc": "containerd", "kata": "containerd"} {
		if id := runPod(t, r, "p-"+handler, handler); !strings.HasPrefix(id, want+"-") {
			t.Errorf("handler %q: sandbox %s, want one of %s", handler, id, want)
		}
	}
	if len(vm.sandboxes) != 1 || len(pass.sandboxes) != 3 {
		t.Fatalf("VM runtime has %d sandboxes, passthrough %d; want 1 and 3", len(vm.sandboxes), len(pass.sandboxes))
	}

	vm.serveDefault = true
	if id := runPod(t, r, "static", ""); !strings.HasPrefix(id, "cocoon-") {
		t.Errorf("with --serve-default-handler the default handler makes VM pods; got %s", id)
	}
}

func TestWithoutPassthroughEverythingIsTheVMRuntimes(t *testing.T) {
	r, vm, _ := newRouter(true)
	runPod(t, r, "a", "runc")
	if _, err := r.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: "unknown"}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, vm, "RunPodSandbox", "StopPodSandbox unknown")
}

func TestIDsGoToTheirOwner(t *testing.T) {
	r, vm, pass := newRouter(false)
	vmPod := runPod(t, r, "vm", "cocoon")
	ctrPod := runPod(t, r, "ctr", "")
	vm.calls, pass.calls = nil, nil

	for _, id := range []string{vmPod, vmPod[:9]} {
		if _, err := r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id}); err != nil && id == vmPod {
			t.Fatal(err)
		}
	}
	if _, err := r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: ctrPod}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, vm, "PodSandboxStatus "+vmPod, "PodSandboxStatus "+vmPod[:9])
	wantCalls(t, pass, "PodSandboxStatus "+ctrPod)

	// An ID nobody has goes to the passthrough runtime, whose NotFound comes back as it is.
	_, err := r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "nosuch"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "containerd: no sandbox nosuch") {
		t.Fatalf("unknown sandbox: %v", err)
	}

	// Containers follow their sandbox at creation and their own ID after.
	vmCtr, err := r.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: vmPod,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctrCtr, err := r.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: ctrPod,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "y"}}})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{vmCtr.GetContainerId(): "http://cocoon/exec", ctrCtr.GetContainerId(): "http://containerd/exec"} {
		resp, err := r.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: id})
		if err != nil || resp.GetUrl() != want {
			t.Errorf("exec %s: %v %v, want the owner's own URL %s", id, resp.GetUrl(), err, want)
		}
	}
}

func TestEmptyIDsAreRefusedBeforeRouting(t *testing.T) {
	r, vm, pass := newRouter(false)
	_, err1 := r.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{})
	_, err2 := r.ExecSync(ctx, &runtimeapi.ExecSyncRequest{})
	_, err3 := r.PullImage(ctx, &runtimeapi.PullImageRequest{})
	for _, err := range []error{err1, err2, err3} {
		if grpcerr.Code(err) != codes.InvalidArgument {
			t.Errorf("got %v, want InvalidArgument", err)
		}
	}
	wantCalls(t, vm)
	wantCalls(t, pass)
}

func TestListsMergeBothRuntimes(t *testing.T) {
	r, vm, pass := newRouter(false)
	runPod(t, r, "a", "cocoon")
	runPod(t, r, "b", "runc")
	runPod(t, r, "c", "")

	filter := &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "web"}}
	resp, err := r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range resp.GetItems() {
		ids = append(ids, s.GetId())
	}
	if want := []string{"cocoon-a", "containerd-b", "containerd-c"}; !slices.Equal(ids, want) {
		t.Fatalf("merged list %v, want %v", ids, want)
	}
	for _, f := range []*fakeRuntime{vm.fakeRuntime, pass} {
		if !proto.Equal(f.lastFilter.(*runtimeapi.PodSandboxFilter), filter) {
			t.Errorf("%s got filter %v, want %v unchanged", f.name, f.lastFilter, filter)
		}
	}

	// A filter naming one sandbox asks only its owner.
	vm.calls, pass.calls = nil, nil
	if _, err := r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: "containerd-b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: "cocoon-a"}}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, vm, "ListContainers")
	wantCalls(t, pass, "ListPodSandbox")

	// One runtime failing fails the list: a partial list would make the kubelet think the other
	// runtime's pods are gone.
	pass.listErr = status.Error(codes.Unavailable, "passthrough runtime x is unavailable")
	if _, err := r.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("list with the passthrough runtime down: %v, want Unavailable", err)
	}
}

// memStream is a server stream that keeps what is sent to it.
type memStream[T any] struct {
	grpc.ServerStream
	ctx  context.Context
	sent []*T
}

func (m *memStream[T]) Context() context.Context { return m.ctx }
func (m *memStream[T]) Send(v *T) error {
	m.sent = append(m.sent, v)
	return nil
}

func TestStreamListsSendEachRuntimeOnce(t *testing.T) {
	r, _, pass := newRouter(false)
	runPod(t, r, "a", "cocoon")
	runPod(t, r, "b", "")
	stream := &memStream[runtimeapi.StreamPodSandboxesResponse]{ctx: ctx}
	if err := r.StreamPodSandboxes(&runtimeapi.StreamPodSandboxesRequest{}, stream); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range stream.sent {
		for _, s := range m.GetPodSandboxes() {
			ids = append(ids, s.GetId())
		}
	}
	if !slices.Equal(ids, []string{"cocoon-a", "containerd-b"}) {
		t.Fatalf("streamed %v", ids)
	}
	pass.listErr = status.Error(codes.Unavailable, "down")
	if err := r.StreamPodSandboxes(&runtimeapi.StreamPodSandboxesRequest{}, &memStream[runtimeapi.StreamPodSandboxesResponse]{ctx: ctx}); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream with the passthrough runtime down: %v", err)
	}
}

func condition(resp *runtimeapi.StatusResponse, typ string) *runtimeapi.RuntimeCondition {
	for _, c := range resp.GetStatus().GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

func TestStatusIsReadyOnlyWhenBothAre(t *testing.T) {
	r, vm, pass := newRouter(false)
	driver := runtimeapi.CgroupDriver_CGROUPFS
	pass.driver = &driver
	pass.status.Status.Conditions = append(pass.status.Status.Conditions, &runtimeapi.RuntimeCondition{Type: "ContainerdHasNoDeprecationWarnings", Status: true})
	pass.status.Info = map[string]string{"config": "{}"}
	vm.status.Info = map[string]string{"info": "{}"}

	resp, err := r.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if !condition(resp, runtimeapi.RuntimeReady).GetStatus() || !condition(resp, runtimeapi.NetworkReady).GetStatus() {
		t.Fatalf("both ready: %v", resp.GetStatus())
	}
	if condition(resp, "ContainerdHasNoDeprecationWarnings") == nil {
		t.Error("the passthrough runtime's own conditions are dropped")
	}
	var handlers []string
	for _, h := range resp.GetRuntimeHandlers() {
		handlers = append(handlers, h.GetName())
	}
	if !slices.Equal(handlers, []string{"", "runc", "cocoon"}) {
		t.Errorf("handlers %q, want the passthrough runtime's and cocoon", handlers)
	}
	if resp.GetFeatures().GetSupplementalGroupsPolicy() || resp.GetFeatures().GetMountOptions() {
		t.Errorf("features %v: the VM runtime has none, so the node has none", resp.GetFeatures())
	}
	if resp.GetInfo()["info"] != "{}" || resp.GetInfo()["passthrough.config"] != "{}" {
		t.Errorf("verbose info %v", resp.GetInfo())
	}

	// The passthrough runtime not ready: so is the node, and the message says which runtime.
	pass.status = readyStatus("")
	pass.status.Status.Conditions[1] = &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Reason: "NetworkPluginNotReady", Message: "cni config uninitialized"}
	resp, _ = r.Status(ctx, &runtimeapi.StatusRequest{})
	nr := condition(resp, runtimeapi.NetworkReady)
	if nr.GetStatus() || nr.GetReason() != "NetworkPluginNotReady" || !strings.Contains(nr.GetMessage(), "passthrough runtime unix:///run/containerd/containerd.sock: cni config uninitialized") {
		t.Errorf("NetworkReady %v", nr)
	}
	if !condition(resp, runtimeapi.RuntimeReady).GetStatus() {
		t.Error("RuntimeReady turned false with NetworkReady")
	}

	// Down: RuntimeReady is false, naming it; the VM runtime's view is still there.
	pass.statusErr = status.Error(codes.Unavailable, "connection refused")
	resp, err = r.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rr := condition(resp, runtimeapi.RuntimeReady)
	if rr.GetStatus() || rr.GetReason() != reasonPassthroughUnavailable || !strings.Contains(rr.GetMessage(), "containerd.sock does not answer: connection refused") {
		t.Errorf("RuntimeReady with the passthrough runtime down: %v", rr)
	}
}

func TestCgroupDriversMustAgree(t *testing.T) {
	r, vm, pass := newRouter(false)
	systemd := runtimeapi.CgroupDriver_SYSTEMD
	pass.driver = &systemd
	err := r.CheckCgroupDriver(ctx)
	var mismatch *cgroupDriverMismatch
	if !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "cocoon-cri uses cgroupfs") || !strings.Contains(err.Error(), "containerd.sock uses systemd") {
		t.Fatalf("mismatch at start: %v", err)
	}
	resp, _ := r.Status(ctx, &runtimeapi.StatusRequest{})
	if rr := condition(resp, runtimeapi.RuntimeReady); rr.GetStatus() || rr.GetReason() != reasonCgroupDriverMismatch {
		t.Errorf("Status with a mismatch: %v", rr)
	}
	cfg, err := r.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if err != nil || cfg.GetLinux().GetCgroupDriver() != systemd {
		t.Errorf("RuntimeConfig is the passthrough runtime's: %v %v", cfg, err)
	}

	vm.ownDriver = systemd
	if err := r.CheckCgroupDriver(ctx); err != nil {
		t.Fatalf("same drivers: %v", err)
	}
	// A runtime without RuntimeConfig cannot be compared: the VM runtime answers for the node.
	pass.driver = nil
	if err := r.CheckCgroupDriver(ctx); err != nil {
		t.Fatalf("no RuntimeConfig: %v", err)
	}
	cfg, err = r.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if err != nil || cfg.GetLinux().GetCgroupDriver() != systemd || !slices.Contains(vm.got(), "RuntimeConfig") {
		t.Errorf("RuntimeConfig without the passthrough runtime's: %v %v", cfg, err)
	}
	// Down at start: not an error yet, Status checks once it answers.
	pass.statusErr = status.Error(codes.Unavailable, "down")
	pass.driver = &systemd
	vm.ownDriver = runtimeapi.CgroupDriver_CGROUPFS
	if err := r.CheckCgroupDriver(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestUpdateRuntimeConfigReachesBoth(t *testing.T) {
	r, vm, pass := newRouter(false)
	if _, err := r.UpdateRuntimeConfig(ctx, &runtimeapi.UpdateRuntimeConfigRequest{}); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, vm, "UpdateRuntimeConfig")
	wantCalls(t, pass, "UpdateRuntimeConfig")
}

func TestContainerEventsMergeBothStreams(t *testing.T) {
	r, vm, pass := newRouter(false)
	vm.events = []*runtimeapi.ContainerEventResponse{{ContainerId: "vm-1"}, {ContainerId: "vm-2"}}
	pass.events = []*runtimeapi.ContainerEventResponse{{ContainerId: "ctr-1"}}
	pass.eventsEnd = status.Error(codes.Unavailable, "passthrough runtime went away")
	stream := &memStream[runtimeapi.ContainerEventResponse]{ctx: ctx}
	err := r.GetContainerEvents(&runtimeapi.GetEventsRequest{}, stream)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the merged stream ends with the passthrough stream's error: got %v", err)
	}
	// The VM runtime's events may or may not have gone out before the passthrough stream ended;
	// those that did are its own, in order, and the passthrough runtime's one went out.
	var got []string
	for _, ev := range stream.sent {
		got = append(got, ev.GetContainerId())
	}
	if !slices.Contains(got, "ctr-1") || slices.Index(got, "vm-2") >= 0 && slices.Index(got, "vm-2") < slices.Index(got, "vm-1") {
		t.Fatalf("merged events %v", got)
	}

	// The client going away ends both.
	pass.eventsEnd = nil
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- r.GetContainerEvents(&runtimeapi.GetEventsRequest{}, &memStream[runtimeapi.ContainerEventResponse]{ctx: cctx})
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("client gone: %v", err)
	}
}

func TestMetricsMergeWhatEitherServes(t *testing.T) {
	r, _, _ := newRouter(false)
	resp, err := r.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil || len(resp.GetDescriptors()) != 1 || resp.GetDescriptors()[0].GetName() != "containerd_cpu" {
		t.Fatalf("descriptors %v %v", resp, err)
	}
	r2, _, _ := newRouter(true)
	if _, err := r2.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("without passthrough: %v", err)
	}
}

func TestPullImageRouting(t *testing.T) {
	r, vm, pass := newRouter(false)
	vm.vmArtifacts["epoch/ubuntu:24.04"] = true
	pull := func(ref, handler string) (*runtimeapi.PullImageResponse, error) {
		return r.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref, RuntimeHandler: handler},
			Auth: &runtimeapi.AuthConfig{Username: "u"}})
	}
	for ref, want := range map[string]string{"epoch/ubuntu:24.04": "cocoon-id", "nginx:1.27": "containerd-id"} {
		resp, err := pull(ref, "")
		if err != nil || resp.GetImageRef() != want {
			t.Errorf("pull %s: %v %v, want %s", ref, resp, err, want)
		}
	}
	if !slices.Equal(vm.noted, []string{"nginx:1.27"}) {
		t.Errorf("credentials noted for %v; want the passthrough runtime's pull only", vm.noted)
	}
	// A handler decides without asking the registry.
	vm.calls = nil
	if resp, err := pull("nginx:1.27", "cocoon"); err != nil || resp.GetImageRef() != "cocoon-id" {
		t.Errorf("pull with the cocoon handler: %v %v", resp, err)
	}
	if resp, err := pull("epoch/ubuntu:24.04", "runc"); err != nil || resp.GetImageRef() != "containerd-id" {
		t.Errorf("pull with the runc handler: %v %v", resp, err)
	}
	if slices.ContainsFunc(vm.got(), func(c string) bool { return strings.HasPrefix(c, "IsVMArtifact") }) {
		t.Error("a pull with a handler asked the registry")
	}

	// A reference the registry cannot tell goes to the passthrough runtime, and if that fails
	// too, both reasons are in the error, with the passthrough runtime's code.
	vm.classifyErr = errors.New("registry.internal: no such host")
	pass.pullErr = status.Error(codes.NotFound, "failed to resolve reference")
	_, err := pull("registry.internal/x:1", "")
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "failed to resolve reference") || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("unclassified pull: %v", err)
	}
	pass.pullErr = nil
	if _, err := pull("registry.internal/x:1", ""); err != nil {
		t.Fatalf("unclassified pull the passthrough runtime can do: %v", err)
	}
}

func TestImageStatusRemoveAndList(t *testing.T) {
	r, vm, pass := newRouter(false)
	vm.images = []*runtimeapi.Image{
		{Id: "sha256:snap", RepoTags: []string{"epoch/ubuntu:24.04"}},
		{Id: "sha256:vmimg", RepoTags: []string{"reg/vmimage:1"}},
		{Id: "sha256:old", RepoTags: []string{"reg/old:1"}},
	}
	vm.vmArtifacts["epoch/ubuntu:24.04"] = true
	pass.images = []*runtimeapi.Image{
		{Id: "sha256:vmimg", RepoTags: []string{"reg/vmimage:latest"}},
		{Id: "sha256:nginx", RepoTags: []string{"nginx:1.27"}},
	}
	statusOf := func(ref string) *runtimeapi.Image {
		t.Helper()
		resp, err := r.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetImage()
	}
	if statusOf("epoch/ubuntu:24.04").GetId() != "sha256:snap" || statusOf("nginx:1.27").GetId() != "sha256:nginx" {
		t.Error("ImageStatus does not find each runtime's images")
	}
	if statusOf("reg/old:1").GetId() != "sha256:old" {
		t.Error("an OCI image only the VM runtime has is not found")
	}
	if statusOf("nosuch:1") != nil {
		t.Error("a missing image is found")
	}
	if slices.Contains(pass.got(), "ImageStatus epoch/ubuntu:24.04") {
		t.Error("the passthrough runtime was asked about a cocoon artifact")
	}

	list, err := r.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string][]string{}
	for _, img := range list.GetImages() {
		if _, dup := byID[img.GetId()]; dup {
			t.Fatalf("%s listed twice", img.GetId())
		}
		byID[img.GetId()] = img.GetRepoTags()
	}
	if len(byID) != 4 || !slices.Equal(byID["sha256:vmimg"], []string{"reg/vmimage:latest", "reg/vmimage:1"}) {
		t.Errorf("merged images %v", byID)
	}

	vm.calls, pass.calls = nil, nil
	for _, ref := range []string{"epoch/ubuntu:24.04", "nginx:1.27"} {
		if _, err := r.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
			t.Fatal(err)
		}
	}
	wantCalls(t, vm, "RemoveImage epoch/ubuntu:24.04", "RemoveImage nginx:1.27")
	wantCalls(t, pass, "RemoveImage nginx:1.27")
}

func TestImageFsInfoSharesOneFilesystem(t *testing.T) {
	r, vm, pass := newRouter(false)
	dir := t.TempDir()
	vm.fsMount, pass.fsMount = filepath.Join(dir), filepath.Join(dir, ".")
	resp, err := r.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetImageFilesystems()) != 1 || resp.GetImageFilesystems()[0].GetUsedBytes().GetValue() != 2000 ||
		resp.GetContainerFilesystems()[0].GetInodesUsed().GetValue() != 10 {
		t.Fatalf("one filesystem: %v", resp)
	}
	vm.fsMount = filepath.Join(dir, "missing")
	resp, _ = r.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	fss := resp.GetImageFilesystems()
	if len(fss) != 2 || fss[0].GetFsId().GetMountpoint() != pass.fsMount {
		t.Fatalf("two filesystems, the passthrough runtime's first (the kubelet reads the first): %v", fss)
	}
}

// TestImageFsInfoWithoutThePassthroughRuntime: clients check the image service with ImageFsInfo
// before anything else; with containerd down they still reach the VM pods, with cocoon's
// filesystems. A refusal of the passthrough runtime is still an error.
func TestImageFsInfoWithoutThePassthroughRuntime(t *testing.T) {
	r, vm, pass := newRouter(false)
	vm.fsMount, pass.fsMount = "/vm", "/pass"
	pass.fsErr = status.Error(codes.Unavailable, "passthrough runtime x is unavailable")
	resp, err := r.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatalf("ImageFsInfo with the passthrough runtime down: %v", err)
	}
	if fss := resp.GetImageFilesystems(); len(fss) != 1 || fss[0].GetFsId().GetMountpoint() != "/vm" {
		t.Fatalf("image filesystems with the passthrough runtime down: %v", fss)
	}
	pass.fsErr = status.Error(codes.Internal, "broken")
	if _, err := r.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("ImageFsInfo with the passthrough runtime failing: %v, want its Internal", err)
	}
}

// recorder is an RPCObserver.
type recorder struct {
	done      []string
	took, own []time.Duration
}

func (rec *recorder) RPCDone(method, runtime string, took time.Duration, code codes.Code) {
	rec.done = append(rec.done, fmt.Sprintf("%s %s %s", method, runtime, code))
	rec.took = append(rec.took, took)
}

func (rec *recorder) RPCOwnTime(_, _ string, own time.Duration) { rec.own = append(rec.own, own) }

// An RPC's own time is its time less what it waited on other programs: all of it when it waits on
// nothing, and at most its time less the wait when it does.
func TestInterceptorSeparatesOwnTimeFromWaits(t *testing.T) {
	rec := &recorder{}
	unary, _ := Interceptors(discard, rec)
	info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.RuntimeService/StopContainer"}
	if _, err := unary(ctx, nil, info, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	const wait = 50 * time.Millisecond
	_, err := unary(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
		end := waittime.Begin(ctx) // as a cocoon call does
		time.Sleep(wait)
		end()
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.own) != 2 {
		t.Fatalf("own times %v, want one per RPC", rec.own)
	}
	if rec.own[0] != rec.took[0] {
		t.Errorf("an RPC that waited on nothing: own %v, want all of its %v", rec.own[0], rec.took[0])
	}
	if rec.own[1] > rec.took[1]-wait {
		t.Errorf("an RPC that waited %v: own %v of %v", wait, rec.own[1], rec.took[1])
	}
}

func TestInterceptorMapsLogsAndCountsForBothRuntimes(t *testing.T) {
	r, _, _ := newRouter(false)
	vmPod := runPod(t, r, "vm", "cocoon")
	rec := &recorder{}
	unary, _ := Interceptors(discard, rec)
	invoke := func(method string, handler grpc.UnaryHandler) error {
		_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
		return err
	}
	err := invoke("/runtime.v1.RuntimeService/PodSandboxStatus", func(ctx context.Context, _ any) (any, error) {
		return r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: vmPod})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = invoke("/runtime.v1.RuntimeService/PodSandboxStatus", func(ctx context.Context, _ any) (any, error) {
		return r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "nosuch"})
	})
	if status.Code(err) != codes.NotFound {
		t.Fatal(err)
	}
	_ = invoke("/runtime.v1.RuntimeService/ListPodSandbox", func(ctx context.Context, _ any) (any, error) {
		return r.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	})
	// A plain error of the layers below gets its code here, once.
	err = invoke("/runtime.v1.RuntimeService/ContainerStatus", func(context.Context, any) (any, error) {
		return nil, fmt.Errorf("container x: %w", store.ErrNotFound)
	})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "container x") {
		t.Fatalf("mapped error: %v", err)
	}
	want := []string{
		"/runtime.v1.RuntimeService/PodSandboxStatus cocoon OK",
		"/runtime.v1.RuntimeService/PodSandboxStatus passthrough NotFound",
		"/runtime.v1.RuntimeService/ListPodSandbox both OK",
		"/runtime.v1.RuntimeService/ContainerStatus cocoon NotFound",
	}
	if !slices.Equal(rec.done, want) {
		t.Fatalf("observed %q, want %q", rec.done, want)
	}
}

package cri

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime is an in-process CRI runtime for the router's tests: it records every call it gets
// and answers from what the test put in it. RPCs a test does not set up answer Unimplemented.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	name       string
	mu         sync.Mutex
	calls      []string
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
	images     []*runtimeapi.Image
	status     *runtimeapi.StatusResponse
	statusErr  error
	driver     *runtimeapi.CgroupDriver // nil: RuntimeConfig is Unimplemented
	listErr    error
	fsMount    string
	fsErr      error
	events     []*runtimeapi.ContainerEventResponse
	eventsEnd  error // how the event stream ends once its events are sent; nil: when the client goes
	pullErr    error
	// lastFilter is the last list filter seen, to check it reached the runtime unchanged.
	lastFilter any
}

func newFake(name string) *fakeRuntime {
	return &fakeRuntime{name: name, status: readyStatus(name)}
}

func readyStatus(handlers ...string) *runtimeapi.StatusResponse {
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: true},
	}}, Features: &runtimeapi.RuntimeFeatures{SupplementalGroupsPolicy: true, MountOptions: true}}
	for _, h := range handlers {
		resp.RuntimeHandlers = append(resp.RuntimeHandlers, &runtimeapi.RuntimeHandler{Name: h})
	}
	return resp
}

func (f *fakeRuntime) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeRuntime) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeRuntime) sandbox(id string) *runtimeapi.PodSandbox {
	for _, s := range f.sandboxes {
		if s.Id == id {
			return s
		}
	}
	return nil
}

func (f *fakeRuntime) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	f.record("RunPodSandbox")
	id := f.name + "-" + req.GetConfig().GetMetadata().GetName()
	f.sandboxes = append(f.sandboxes, &runtimeapi.PodSandbox{Id: id, RuntimeHandler: req.GetRuntimeHandler()})
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (f *fakeRuntime) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.record("StopPodSandbox " + req.GetPodSandboxId())
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.record("PodSandboxStatus " + req.GetPodSandboxId())
	if s := f.sandbox(req.GetPodSandboxId()); s != nil {
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: s.Id}}, nil
	}
	return nil, status.Errorf(codes.NotFound, "%s: no sandbox %s", f.name, req.GetPodSandboxId())
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.record("ListPodSandbox")
	f.lastFilter = req.GetFilter()
	if f.listErr != nil {
		return nil, f.listErr
	}
	return &runtimeapi.ListPodSandboxResponse{Items: f.sandboxes}, nil
}

func (f *fakeRuntime) StreamPodSandboxes(_ *runtimeapi.StreamPodSandboxesRequest, stream runtimeapi.RuntimeService_StreamPodSandboxesServer) error {
	f.record("StreamPodSandboxes")
	if f.listErr != nil {
		return f.listErr
	}
	return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: f.sandboxes})
}

func (f *fakeRuntime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.record("CreateContainer " + req.GetPodSandboxId())
	id := f.name + "-c-" + req.GetConfig().GetMetadata().GetName()
	f.containers = append(f.containers, &runtimeapi.Container{Id: id, PodSandboxId: req.GetPodSandboxId()})
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (f *fakeRuntime) ExecSync(_ context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	f.record("ExecSync " + req.GetContainerId())
	return &runtimeapi.ExecSyncResponse{Stdout: []byte(f.name)}, nil
}

func (f *fakeRuntime) Exec(_ context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	f.record("Exec " + req.GetContainerId())
	return &runtimeapi.ExecResponse{Url: "http://" + f.name + "/exec"}, nil
}

func (f *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.record("ListContainers")
	f.lastFilter = req.GetFilter()
	if f.listErr != nil {
		return nil, f.listErr
	}
	return &runtimeapi.ListContainersResponse{Containers: f.containers}, nil
}

func (f *fakeRuntime) ListContainerStats(_ context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	f.record("ListContainerStats")
	f.lastFilter = req.GetFilter()
	var out []*runtimeapi.ContainerStats
	for _, c := range f.containers {
		out = append(out, &runtimeapi.ContainerStats{Attributes: &runtimeapi.ContainerAttributes{Id: c.Id}})
	}
	return &runtimeapi.ListContainerStatsResponse{Stats: out}, f.listErr
}

func (f *fakeRuntime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	f.record("Status")
	return f.status, f.statusErr
}

func (f *fakeRuntime) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	f.record("RuntimeConfig")
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	if f.driver == nil {
		return nil, status.Error(codes.Unimplemented, "no RuntimeConfig")
	}
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: *f.driver}}, nil
}

func (f *fakeRuntime) UpdateRuntimeConfig(context.Context, *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	f.record("UpdateRuntimeConfig")
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	f.record("GetContainerEvents")
	for _, ev := range f.events {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	if f.eventsEnd != nil {
		return f.eventsEnd
	}
	<-stream.Context().Done()
	return nil
}

func (f *fakeRuntime) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	f.record("ListMetricDescriptors")
	if f.name == "cocoon" {
		return nil, status.Error(codes.Unimplemented, "no metrics")
	}
	return &runtimeapi.ListMetricDescriptorsResponse{Descriptors: []*runtimeapi.MetricDescriptor{{Name: f.name + "_cpu"}}}, nil
}

func (f *fakeRuntime) image(ref string) *runtimeapi.Image {
	for _, img := range f.images {
		if img.Id == ref || slices.Contains(img.RepoTags, ref) {
			return img
		}
	}
	return nil
}

func (f *fakeRuntime) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	f.record("PullImage " + req.GetImage().GetImage())
	if f.pullErr != nil {
		return nil, f.pullErr
	}
	return &runtimeapi.PullImageResponse{ImageRef: f.name + "-id"}, nil
}

func (f *fakeRuntime) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	f.record("ImageStatus " + req.GetImage().GetImage())
	return &runtimeapi.ImageStatusResponse{Image: f.image(req.GetImage().GetImage())}, nil
}

func (f *fakeRuntime) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	f.record("RemoveImage " + req.GetImage().GetImage())
	return &runtimeapi.RemoveImageResponse{}, nil
}

func (f *fakeRuntime) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	f.record("ListImages")
	return &runtimeapi.ListImagesResponse{Images: f.images}, nil
}

func (f *fakeRuntime) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	f.record("ImageFsInfo")
	if f.fsErr != nil {
		return nil, f.fsErr
	}
	fs := func(used uint64) []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{Timestamp: 1, FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: f.fsMount},
			UsedBytes: &runtimeapi.UInt64Value{Value: used}, InodesUsed: &runtimeapi.UInt64Value{Value: used / 100}}}
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: fs(1000), ContainerFilesystems: fs(500)}, nil
}

// fakeVM is the VM runtime: a fakeRuntime that owns the IDs and images of its records.
type fakeVM struct {
	*fakeRuntime
	serveDefault bool
	vmArtifacts  map[string]bool // ref -> is a cocoon artifact, as the registry would say
	classifyErr  error
	noted        []string
	ownDriver    runtimeapi.CgroupDriver
}

func newFakeVM() *fakeVM {
	f := newFake("cocoon")
	f.status = readyStatus("cocoon")
	f.status.Features = &runtimeapi.RuntimeFeatures{}
	return &fakeVM{fakeRuntime: f, vmArtifacts: map[string]bool{}, ownDriver: runtimeapi.CgroupDriver_CGROUPFS}
}

func (v *fakeVM) HandlerName() string { return "cocoon" }
func (v *fakeVM) ServesHandler(h string) bool {
	return h == "cocoon" || (h == "" && v.serveDefault)
}
func (v *fakeVM) OwnsSandbox(id string) bool {
	return slices.ContainsFunc(v.sandboxes, func(s *runtimeapi.PodSandbox) bool { return strings.HasPrefix(s.Id, id) })
}
func (v *fakeVM) OwnsContainer(id string) bool {
	return slices.ContainsFunc(v.containers, func(c *runtimeapi.Container) bool { return strings.HasPrefix(c.Id, id) })
}
func (v *fakeVM) HoldsVMArtifact(ref string) bool {
	img := v.image(ref)
	return img != nil && v.vmArtifacts[img.RepoTags[0]]
}
func (v *fakeVM) IsVMArtifact(_ context.Context, ref string, _ *runtimeapi.AuthConfig) (bool, error) {
	v.record("IsVMArtifact " + ref)
	return v.vmArtifacts[ref], v.classifyErr
}
func (v *fakeVM) NotePull(ref string, _ *runtimeapi.AuthConfig) { v.noted = append(v.noted, ref) }
func (v *fakeVM) CgroupDriver() runtimeapi.CgroupDriver         { return v.ownDriver }

var discard = slog.New(slog.DiscardHandler)

// newRouter is a router over a fake VM runtime and, unless noPass, a fake passthrough runtime.
func newRouter(noPass bool) (*Router, *fakeVM, *fakeRuntime) {
	vm := newFakeVM()
	if noPass {
		return New(vm, nil, "", discard), vm, nil
	}
	pass := newFake("containerd")
	pass.status = readyStatus("", "runc")
	return New(vm, pass, "unix:///run/containerd/containerd.sock", discard), vm, pass
}

func (v *fakeVM) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	v.record("RuntimeConfig")
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: v.ownDriver}}, nil
}

package passthrough

import (
	"context"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Every CRI RPC, forwarded as it is. The runtime service first, then the image service, in the
// order of the CRI's api.proto.

// Version forwards to the runtime.
func (r *Runtime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return call(ctx, r, r.rt.Version, req)
}

// RunPodSandbox forwards to the runtime.
func (r *Runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	return call(ctx, r, r.rt.RunPodSandbox, req)
}

// StopPodSandbox forwards to the runtime.
func (r *Runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	return call(ctx, r, r.rt.StopPodSandbox, req)
}

// RemovePodSandbox forwards to the runtime.
func (r *Runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	return call(ctx, r, r.rt.RemovePodSandbox, req)
}

// PodSandboxStatus forwards to the runtime.
func (r *Runtime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	return call(ctx, r, r.rt.PodSandboxStatus, req)
}

// ListPodSandbox forwards to the runtime.
func (r *Runtime) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return call(ctx, r, r.rt.ListPodSandbox, req)
}

// StreamPodSandboxes relays the runtime's stream.
func (r *Runtime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	return relay(r, stream, r.rt.StreamPodSandboxes, req)
}

// CreateContainer forwards to the runtime.
func (r *Runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	return call(ctx, r, r.rt.CreateContainer, req)
}

// StartContainer forwards to the runtime.
func (r *Runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	return call(ctx, r, r.rt.StartContainer, req)
}

// StopContainer forwards to the runtime.
func (r *Runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	return call(ctx, r, r.rt.StopContainer, req)
}

// RemoveContainer forwards to the runtime.
func (r *Runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	return call(ctx, r, r.rt.RemoveContainer, req)
}

// ListContainers forwards to the runtime.
func (r *Runtime) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return call(ctx, r, r.rt.ListContainers, req)
}

// StreamContainers relays the runtime's stream.
func (r *Runtime) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	return relay(r, stream, r.rt.StreamContainers, req)
}

// ContainerStatus forwards to the runtime.
func (r *Runtime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return call(ctx, r, r.rt.ContainerStatus, req)
}

// UpdateContainerResources forwards to the runtime.
func (r *Runtime) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return call(ctx, r, r.rt.UpdateContainerResources, req)
}

// ReopenContainerLog forwards to the runtime.
func (r *Runtime) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return call(ctx, r, r.rt.ReopenContainerLog, req)
}

// ExecSync forwards to the runtime.
func (r *Runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	return call(ctx, r, r.rt.ExecSync, req)
}

// Exec forwards to the runtime.
func (r *Runtime) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return call(ctx, r, r.rt.Exec, req)
}

// Attach forwards to the runtime.
func (r *Runtime) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return call(ctx, r, r.rt.Attach, req)
}

// PortForward forwards to the runtime.
func (r *Runtime) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return call(ctx, r, r.rt.PortForward, req)
}

// ContainerStats forwards to the runtime.
func (r *Runtime) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	return call(ctx, r, r.rt.ContainerStats, req)
}

// ListContainerStats forwards to the runtime.
func (r *Runtime) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return call(ctx, r, r.rt.ListContainerStats, req)
}

// StreamContainerStats relays the runtime's stream.
func (r *Runtime) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainerStatsResponse]) error {
	return relay(r, stream, r.rt.StreamContainerStats, req)
}

// PodSandboxStats forwards to the runtime.
func (r *Runtime) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	return call(ctx, r, r.rt.PodSandboxStats, req)
}

// ListPodSandboxStats forwards to the runtime.
func (r *Runtime) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	return call(ctx, r, r.rt.ListPodSandboxStats, req)
}

// StreamPodSandboxStats relays the runtime's stream.
func (r *Runtime) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxStatsResponse]) error {
	return relay(r, stream, r.rt.StreamPodSandboxStats, req)
}

// UpdateRuntimeConfig forwards to the runtime.
func (r *Runtime) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	return call(ctx, r, r.rt.UpdateRuntimeConfig, req)
}

// Status forwards to the runtime.
func (r *Runtime) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return call(ctx, r, r.rt.Status, req)
}

// CheckpointContainer forwards to the runtime.
func (r *Runtime) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	return call(ctx, r, r.rt.CheckpointContainer, req)
}

// CheckpointPod forwards to the runtime.
func (r *Runtime) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	return call(ctx, r, r.rt.CheckpointPod, req)
}

// RestorePod forwards to the runtime.
func (r *Runtime) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	return call(ctx, r, r.rt.RestorePod, req)
}

// GetContainerEvents relays the runtime's stream.
func (r *Runtime) GetContainerEvents(req *runtimeapi.GetEventsRequest, stream grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	return relay(r, stream, r.rt.GetContainerEvents, req)
}

// ListMetricDescriptors forwards to the runtime.
func (r *Runtime) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return call(ctx, r, r.rt.ListMetricDescriptors, req)
}

// ListPodSandboxMetrics forwards to the runtime.
func (r *Runtime) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return call(ctx, r, r.rt.ListPodSandboxMetrics, req)
}

// StreamPodSandboxMetrics relays the runtime's stream.
func (r *Runtime) StreamPodSandboxMetrics(req *runtimeapi.StreamPodSandboxMetricsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxMetricsResponse]) error {
	return relay(r, stream, r.rt.StreamPodSandboxMetrics, req)
}

// RuntimeConfig forwards to the runtime.
func (r *Runtime) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return call(ctx, r, r.rt.RuntimeConfig, req)
}

// UpdatePodSandboxResources forwards to the runtime.
func (r *Runtime) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	return call(ctx, r, r.rt.UpdatePodSandboxResources, req)
}

// ListImages forwards to the runtime.
func (r *Runtime) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return call(ctx, r, r.img.ListImages, req)
}

// StreamImages relays the runtime's stream.
func (r *Runtime) StreamImages(req *runtimeapi.StreamImagesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamImagesResponse]) error {
	return relay(r, stream, r.img.StreamImages, req)
}

// ImageStatus forwards to the runtime.
func (r *Runtime) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	return call(ctx, r, r.img.ImageStatus, req)
}

// PullImage forwards to the runtime.
func (r *Runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	return call(ctx, r, r.img.PullImage, req)
}

// RemoveImage forwards to the runtime.
func (r *Runtime) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	return call(ctx, r, r.img.RemoveImage, req)
}

// ImageFsInfo forwards to the runtime.
func (r *Runtime) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return call(ctx, r, r.img.ImageFsInfo, req)
}

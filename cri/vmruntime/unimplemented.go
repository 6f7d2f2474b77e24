package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The RPCs below are not served. Each answers codes.Unimplemented with what to do instead;
// docs/cri-support.md lists them.

const (
	insteadResize   = "a running VM cannot be resized; recreate the pod with the new resources"
	insteadCheckpnt = "checkpointing a VM through the CRI is not supported; take a cocoon snapshot on the node (cocoon snapshot save)"
	insteadMetrics  = "CRI pod metrics are not provided; leave the PodAndContainerStatsFromCRI feature gate off"
)

// UpdateContainerResources is not served.
func (s *Server) UpdateContainerResources(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return nil, unimplemented("UpdateContainerResources", insteadResize)
}

// UpdatePodSandboxResources is not served.
func (s *Server) UpdatePodSandboxResources(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	return nil, unimplemented("UpdatePodSandboxResources", insteadResize)
}

// CheckpointContainer is not served.
func (s *Server) CheckpointContainer(context.Context, *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	return nil, unimplemented("CheckpointContainer", insteadCheckpnt)
}

// CheckpointPod is not served.
func (s *Server) CheckpointPod(context.Context, *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	return nil, unimplemented("CheckpointPod", insteadCheckpnt)
}

// RestorePod is not served.
func (s *Server) RestorePod(context.Context, *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	return nil, unimplemented("RestorePod", insteadCheckpnt)
}

// ListMetricDescriptors is not served.
func (s *Server) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return nil, unimplemented("ListMetricDescriptors", insteadMetrics)
}

// ListPodSandboxMetrics is not served.
func (s *Server) ListPodSandboxMetrics(context.Context, *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return nil, unimplemented("ListPodSandboxMetrics", insteadMetrics)
}

// StreamPodSandboxMetrics is not served.
func (s *Server) StreamPodSandboxMetrics(*runtimeapi.StreamPodSandboxMetricsRequest, runtimeapi.RuntimeService_StreamPodSandboxMetricsServer) error {
	return unimplemented("StreamPodSandboxMetrics", insteadMetrics)
}

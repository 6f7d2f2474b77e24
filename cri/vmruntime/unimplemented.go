package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The RPCs below are not served. Each answers codes.Unimplemented with what to do instead;
// docs/cri-support.md lists them.

const (
	insteadResize  = "a running VM cannot be resized; recreate the pod with the new resources"
	insteadMetrics = "CRI pod metrics are not provided; leave the PodAndContainerStatsFromCRI feature gate off"
)

// UpdateContainerResources is not served.
func (s *Runtime) UpdateContainerResources(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return nil, unimplemented("UpdateContainerResources", insteadResize)
}

// UpdatePodSandboxResources is not served.
func (s *Runtime) UpdatePodSandboxResources(context.Context, *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	return nil, unimplemented("UpdatePodSandboxResources", insteadResize)
}

// ListMetricDescriptors is not served.
func (s *Runtime) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return nil, unimplemented("ListMetricDescriptors", insteadMetrics)
}

// ListPodSandboxMetrics is not served.
func (s *Runtime) ListPodSandboxMetrics(context.Context, *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return nil, unimplemented("ListPodSandboxMetrics", insteadMetrics)
}

// StreamPodSandboxMetrics is not served.
func (s *Runtime) StreamPodSandboxMetrics(*runtimeapi.StreamPodSandboxMetricsRequest, runtimeapi.RuntimeService_StreamPodSandboxMetricsServer) error {
	return unimplemented("StreamPodSandboxMetrics", insteadMetrics)
}

package cri

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CreateContainer goes to the owner of the container's sandbox.
func (r *Router) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.CreateContainer(ctx, req)
}

// StartContainer goes to the container's owner.
func (r *Router) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.StartContainer(ctx, req)
}

// StopContainer goes to the container's owner.
func (r *Router) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.StopContainer(ctx, req)
}

// RemoveContainer goes to the container's owner.
func (r *Router) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.RemoveContainer(ctx, req)
}

// ContainerStatus goes to the container's owner.
func (r *Router) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.ContainerStatus(ctx, req)
}

// UpdateContainerResources goes to the container's owner.
func (r *Router) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.UpdateContainerResources(ctx, req)
}

// ReopenContainerLog goes to the container's owner.
func (r *Router) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.ReopenContainerLog(ctx, req)
}

// ExecSync goes to the container's owner.
func (r *Router) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.ExecSync(ctx, req)
}

// Exec goes to the container's owner, whose own stream server the URL names.
func (r *Router) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.Exec(ctx, req)
}

// Attach goes to the container's owner, whose own stream server the URL names.
func (r *Router) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.Attach(ctx, req)
}

// CheckpointContainer goes to the container's owner.
func (r *Router) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.CheckpointContainer(ctx, req)
}

// ListContainers merges both runtimes' containers; the filter goes to both unchanged. A filter
// that names a container or a sandbox asks only its owner.
func (r *Router) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListContainers(ctx, req)
	}
	if b := r.filterOwner(ctx, req.GetFilter().GetId(), req.GetFilter().GetPodSandboxId()); b != nil {
		return b.ListContainers(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListContainersResponse, error) {
		return b.ListContainers(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListContainersResponse{Containers: append(vm.GetContainers(), pass.GetContainers()...)}, nil
}

// StreamContainers sends the VM runtime's containers, then the passthrough runtime's.
func (r *Router) StreamContainers(req *runtimeapi.StreamContainersRequest, stream runtimeapi.RuntimeService_StreamContainersServer) error {
	return r.streamBoth(stream.Context(),
		func(b Backend) error { return b.StreamContainers(req, stream) })
}

// filterOwner is the one runtime a list filter can concern: the owner of the container it names,
// else of the sandbox it names; nil when it names neither and both runtimes must answer.
func (r *Router) filterOwner(ctx context.Context, containerID, sandboxID string) Backend {
	if containerID != "" {
		b, _ := r.containerOwner(ctx, containerID)
		return b
	}
	if sandboxID != "" {
		b, _ := r.sandboxOwner(ctx, sandboxID)
		return b
	}
	return nil
}

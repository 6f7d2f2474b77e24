package cri

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RunPodSandbox goes by the runtime handler: the VM runtime's handler (and the default one with
// --serve-default-handler) makes a VM pod, any other handler a pod of the passthrough runtime.
func (r *Router) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	return r.handlerOwner(ctx, req.GetRuntimeHandler()).RunPodSandbox(ctx, req)
}

// StopPodSandbox goes to the sandbox's owner.
func (r *Router) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.StopPodSandbox(ctx, req)
}

// RemovePodSandbox goes to the sandbox's owner.
func (r *Router) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.RemovePodSandbox(ctx, req)
}

// PodSandboxStatus goes to the sandbox's owner.
func (r *Router) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.PodSandboxStatus(ctx, req)
}

// UpdatePodSandboxResources goes to the sandbox's owner.
func (r *Router) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.UpdatePodSandboxResources(ctx, req)
}

// PortForward goes to the sandbox's owner, whose own stream server the URL names.
func (r *Router) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.PortForward(ctx, req)
}

// ListPodSandbox merges both runtimes' sandboxes; the filter goes to both unchanged. A filter
// that names a sandbox ID asks only its owner.
func (r *Router) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListPodSandbox(ctx, req)
	}
	if b := r.filterOwner(ctx, "", req.GetFilter().GetId()); b != nil {
		return b.ListPodSandbox(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListPodSandboxResponse, error) {
		return b.ListPodSandbox(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListPodSandboxResponse{Items: append(vm.GetItems(), pass.GetItems()...)}, nil
}

// StreamPodSandboxes sends the VM runtime's sandboxes, then the passthrough runtime's.
func (r *Router) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream runtimeapi.RuntimeService_StreamPodSandboxesServer) error {
	return r.streamBoth(stream.Context(),
		func(b Backend) error { return b.StreamPodSandboxes(req, stream) })
}

// streamBoth runs a streaming list on the VM runtime and then, with passthrough, on the other
// runtime, into the same stream: each item is sent once, and an error of either ends the stream
// with that error, so the client never takes a partial list for the whole.
func (r *Router) streamBoth(ctx context.Context, send func(Backend) error) error {
	if r.pass == nil {
		return send(r.toVM(ctx))
	}
	serve(ctx, servedByBoth)
	if err := send(r.vm); err != nil {
		return err
	}
	return send(r.pass)
}

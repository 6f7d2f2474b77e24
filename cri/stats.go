package cri

import (
	"context"
	"sync/atomic"

	"github.com/cocoonstack/cocoon-cri/cri/grpcerr"
	"github.com/containerd/errdefs"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ContainerStats goes to the container's owner.
func (r *Router) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	b, err := r.containerOwner(ctx, req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return b.ContainerStats(ctx, req)
}

// PodSandboxStats goes to the sandbox's owner.
func (r *Router) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	b, err := r.sandboxOwner(ctx, req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	return b.PodSandboxStats(ctx, req)
}

// ListContainerStats merges both runtimes' figures; the filter goes to both unchanged.
func (r *Router) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListContainerStats(ctx, req)
	}
	if b := r.filterOwner(ctx, req.GetFilter().GetId(), req.GetFilter().GetPodSandboxId()); b != nil {
		return b.ListContainerStats(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListContainerStatsResponse, error) {
		return b.ListContainerStats(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListContainerStatsResponse{Stats: append(vm.GetStats(), pass.GetStats()...)}, nil
}

// StreamContainerStats sends the VM runtime's figures, then the passthrough runtime's.
func (r *Router) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream runtimeapi.RuntimeService_StreamContainerStatsServer) error {
	return r.streamBoth(stream.Context(),
		func(b Backend) error { return b.StreamContainerStats(req, stream) })
}

// ListPodSandboxStats merges both runtimes' figures; the filter goes to both unchanged.
func (r *Router) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListPodSandboxStats(ctx, req)
	}
	if b := r.filterOwner(ctx, "", req.GetFilter().GetId()); b != nil {
		return b.ListPodSandboxStats(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListPodSandboxStatsResponse, error) {
		return b.ListPodSandboxStats(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListPodSandboxStatsResponse{Stats: append(vm.GetStats(), pass.GetStats()...)}, nil
}

// StreamPodSandboxStats sends the VM runtime's figures, then the passthrough runtime's.
func (r *Router) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream runtimeapi.RuntimeService_StreamPodSandboxStatsServer) error {
	return r.streamBoth(stream.Context(),
		func(b Backend) error { return b.StreamPodSandboxStats(req, stream) })
}

// ListMetricDescriptors merges the descriptors both runtimes serve. The VM runtime serves none
// (Unimplemented); a runtime that does not serve the call adds nothing, and only when neither
// serves it is the answer Unimplemented.
func (r *Router) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListMetricDescriptors(ctx, req)
	}
	vm, pass, err := fromBothServing(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListMetricDescriptorsResponse, error) {
		return b.ListMetricDescriptors(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListMetricDescriptorsResponse{Descriptors: append(vm.GetDescriptors(), pass.GetDescriptors()...)}, nil
}

// ListPodSandboxMetrics merges the pod metrics both runtimes serve, as ListMetricDescriptors.
func (r *Router) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListPodSandboxMetrics(ctx, req)
	}
	vm, pass, err := fromBothServing(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
		return b.ListPodSandboxMetrics(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListPodSandboxMetricsResponse{PodMetrics: append(vm.GetPodMetrics(), pass.GetPodMetrics()...)}, nil
}

// StreamPodSandboxMetrics sends the pod metrics of whichever runtimes serve them.
func (r *Router) StreamPodSandboxMetrics(req *runtimeapi.StreamPodSandboxMetricsRequest, stream runtimeapi.RuntimeService_StreamPodSandboxMetricsServer) error {
	if r.pass == nil {
		return r.toVM(stream.Context()).StreamPodSandboxMetrics(req, stream)
	}
	unimplemented := 0
	err := r.streamBoth(stream.Context(), func(b Backend) error {
		err := b.StreamPodSandboxMetrics(req, stream)
		if grpcerr.Code(err) == codes.Unimplemented {
			unimplemented++
			return nil
		}
		return err
	})
	if err == nil && unimplemented == 2 {
		return errNoPodMetrics
	}
	return err
}

var errNoPodMetrics = errdefs.ErrNotImplemented.WithMessage(
	"neither runtime serves CRI pod metrics; leave the kubelet's PodAndContainerStatsFromCRI feature gate off")

// fromBothServing is fromBoth where a runtime that answers Unimplemented adds nothing; when both
// do, so does the router.
func fromBothServing[T any](ctx context.Context, r *Router, ask func(context.Context, Backend) (*T, error)) (vm, pass *T, err error) {
	var unimplemented atomic.Int32
	vm, pass, err = fromBoth(ctx, r, func(ctx context.Context, b Backend) (*T, error) {
		resp, err := ask(ctx, b)
		if grpcerr.Code(err) == codes.Unimplemented {
			unimplemented.Add(1)
			return new(T), nil
		}
		return resp, err
	})
	if err == nil && unimplemented.Load() == 2 {
		return nil, nil, errNoPodMetrics
	}
	return vm, pass, err
}

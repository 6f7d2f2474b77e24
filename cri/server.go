// Package cri is the CRI edge: the RuntimeService and ImageService the kubelet talks to. It hands
// each request to the runtime that owns it, cocoon-cri's VM runtime (cri/vmruntime) or, with
// passthrough, the node's container runtime (cri/passthrough), and merges the answers of both
// where the kubelet asks about the whole node. One file per RPC family, as in the runtimes
// themselves; docs/cri-support.md has the routing rules.
package cri

import (
	"context"
	"log/slog"

	"github.com/containerd/errdefs"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Router implements runtimeapi.RuntimeServiceServer and runtimeapi.ImageServiceServer over the VM
// runtime and, optionally, a passthrough runtime. It holds no state of its own: who owns a sandbox,
// container or image is asked of the VM runtime's records each time, so a restart loses nothing.
// It never holds a lock of the VM runtime while it calls the passthrough runtime.
type Router struct {
	runtimeapi.UnsafeRuntimeServiceServer
	runtimeapi.UnsafeImageServiceServer

	vm VMBackend
	// pass is the passthrough runtime; nil without --passthrough-endpoint, and then every request
	// is the VM runtime's, which refuses what it does not serve.
	pass     Backend
	passName string
	log      *slog.Logger
	cgroups  *cgroupCheck
}

// New returns the edge over vm and, when pass is not nil, the passthrough runtime at passName.
func New(vm VMBackend, pass Backend, passName string, log *slog.Logger) *Router {
	r := &Router{vm: vm, pass: pass, passName: passName, log: log}
	if pass != nil {
		r.cgroups = newCgroupCheck(vm, pass, passName)
	}
	return r
}

// Register adds both CRI services to a gRPC server.
func (r *Router) Register(g *grpc.Server) {
	runtimeapi.RegisterRuntimeServiceServer(g, r)
	runtimeapi.RegisterImageServiceServer(g, r)
}

// toVM and toPassthrough pick a runtime for the RPC in ctx and note it for the interceptor.
func (r *Router) toVM(ctx context.Context) Backend {
	serve(ctx, servedByVM)
	return r.vm
}

func (r *Router) toPassthrough(ctx context.Context) Backend {
	serve(ctx, servedByPassthrough)
	return r.pass
}

// sandboxOwner is the runtime whose sandbox id names: the VM runtime's records first, anything
// else the passthrough runtime's, whose NotFound then comes back as it is.
func (r *Router) sandboxOwner(ctx context.Context, id string) (Backend, error) {
	if id == "" {
		return nil, errdefs.ErrInvalidArgument.WithMessage("pod sandbox ID is required")
	}
	if r.pass == nil || r.vm.OwnsSandbox(id) {
		return r.toVM(ctx), nil
	}
	return r.toPassthrough(ctx), nil
}

// containerOwner is sandboxOwner for containers.
func (r *Router) containerOwner(ctx context.Context, id string) (Backend, error) {
	if id == "" {
		return nil, errdefs.ErrInvalidArgument.WithMessage("container ID is required")
	}
	if r.pass == nil || r.vm.OwnsContainer(id) {
		return r.toVM(ctx), nil
	}
	return r.toPassthrough(ctx), nil
}

// handlerOwner is the runtime that makes pods for a RuntimeClass handler.
func (r *Router) handlerOwner(ctx context.Context, handler string) Backend {
	if r.pass == nil || r.vm.ServesHandler(handler) {
		return r.toVM(ctx)
	}
	return r.toPassthrough(ctx)
}

// fromBoth asks both runtimes at once and returns both answers, or the first error: a merged
// answer that left one runtime out would tell the kubelet that runtime's pods are gone.
func fromBoth[T any](ctx context.Context, r *Router, ask func(context.Context, Backend) (T, error)) (vm, pass T, err error) {
	serve(ctx, servedByBoth)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		vm, err = ask(gctx, r.vm)
		return err
	})
	g.Go(func() (err error) {
		pass, err = ask(gctx, r.pass)
		return err
	})
	err = g.Wait()
	return vm, pass, err
}

package cri

import (
	"context"
	"slices"
	"syscall"

	"github.com/containerd/errdefs"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The image rules (docs/images.md): the kubelet's image calls name no runtime handler unless its
// RuntimeClassInImageCriAPI gate is on. Cocoon artifacts, snapshots and cloud images, are the VM
// runtime's alone; any other image is the passthrough runtime's, and a VM pod that needs one as
// an OCI VM image has the VM runtime bring it in at CreateContainer.

// imageOwner is the runtime an image request with a runtime handler belongs to, or nil when the
// request names none.
func (r *Router) imageOwner(ctx context.Context, spec *runtimeapi.ImageSpec) Backend {
	if r.pass == nil {
		return r.toVM(ctx)
	}
	if h := spec.GetRuntimeHandler(); h != "" {
		return r.handlerOwner(ctx, h)
	}
	if r.vm.HoldsVMArtifact(spec.GetImage()) {
		return r.toVM(ctx)
	}
	return nil
}

// PullImage goes by the runtime handler when the request has one. Otherwise the reference is
// resolved in its registry: a cocoon artifact goes to the VM runtime, anything else to the
// passthrough runtime, and so does a reference that cannot be resolved here (the other runtime
// may have mirrors and credentials of its own), with what went wrong added to its error.
func (r *Router) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, errdefs.ErrInvalidArgument.WithMessage("image is required")
	}
	if b := r.imageOwner(ctx, req.GetImage()); b != nil {
		return b.PullImage(ctx, req)
	}
	isVM, classifyErr := r.vm.IsVMArtifact(ctx, ref, req.GetAuth())
	if classifyErr == nil && isVM {
		return r.toVM(ctx).PullImage(ctx, req)
	}
	resp, err := r.toPassthrough(ctx).PullImage(ctx, req)
	switch {
	case err == nil:
		r.vm.NotePull(ref, req.GetAuth())
	case classifyErr != nil:
		st := status.Convert(err)
		return nil, status.Errorf(st.Code(), "%s (cocoon-cri could not tell whether %s is a cocoon artifact either: %v)", st.Message(), ref, classifyErr)
	}
	return resp, err
}

// ImageStatus answers for a cocoon artifact from the VM runtime and for any other image from the
// passthrough runtime, which pulled it; only an image the passthrough runtime does not have is
// looked for in the VM runtime (an OCI VM image pulled before passthrough was configured).
func (r *Router) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	if req.GetImage().GetImage() == "" {
		return nil, errdefs.ErrInvalidArgument.WithMessage("image is required")
	}
	if b := r.imageOwner(ctx, req.GetImage()); b != nil {
		return b.ImageStatus(ctx, req)
	}
	resp, err := r.toPassthrough(ctx).ImageStatus(ctx, req)
	if err != nil || resp.GetImage() != nil {
		return resp, err
	}
	return r.toVM(ctx).ImageStatus(ctx, req)
}

// RemoveImage removes a cocoon artifact from the VM runtime, and any other image from both
// runtimes: each removes what it has, and a missing image is no error in either.
func (r *Router) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	if req.GetImage().GetImage() == "" {
		return nil, errdefs.ErrInvalidArgument.WithMessage("image is required")
	}
	if b := r.imageOwner(ctx, req.GetImage()); b != nil {
		return b.RemoveImage(ctx, req)
	}
	if _, _, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.RemoveImageResponse, error) {
		return b.RemoveImage(ctx, req)
	}); err != nil {
		return nil, err
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ListImages merges both runtimes' images. An image both hold (an OCI VM image the VM runtime
// brought in) is listed once, with the references of both.
func (r *Router) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ListImages(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ListImagesResponse, error) {
		return b.ListImages(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ListImagesResponse{Images: mergeImages(pass.GetImages(), vm.GetImages())}, nil
}

// StreamImages sends the merged list in one message: an image both runtimes hold must appear once.
func (r *Router) StreamImages(req *runtimeapi.StreamImagesRequest, stream runtimeapi.ImageService_StreamImagesServer) error {
	if r.pass == nil {
		return r.toVM(stream.Context()).StreamImages(req, stream)
	}
	list, err := r.ListImages(stream.Context(), &runtimeapi.ListImagesRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	return stream.Send(&runtimeapi.StreamImagesResponse{Images: list.GetImages()})
}

func mergeImages(first, second []*runtimeapi.Image) []*runtimeapi.Image {
	out := slices.Clone(first)
	for _, img := range second {
		i := slices.IndexFunc(out, func(o *runtimeapi.Image) bool { return o.GetId() == img.GetId() })
		if i < 0 {
			out = append(out, img)
			continue
		}
		merged := proto.CloneOf(out[i])
		merged.RepoTags = union(merged.GetRepoTags(), img.GetRepoTags())
		merged.RepoDigests = union(merged.GetRepoDigests(), img.GetRepoDigests())
		out[i] = merged
	}
	return out
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ImageFsInfo reports both runtimes' filesystems, the passthrough runtime's first: the kubelet
// reads only the first one. Where both keep their data on one filesystem, that filesystem is
// listed once with the usage of both. With the passthrough runtime unreachable it reports
// cocoon's alone: the kubelet and crictl call ImageFsInfo to check the image service before
// anything else, and must not be refused the VM pods because containerd is down.
func (r *Router) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	if r.pass == nil {
		return r.toVM(ctx).ImageFsInfo(ctx, req)
	}
	vm, pass, err := fromBoth(ctx, r, func(ctx context.Context, b Backend) (*runtimeapi.ImageFsInfoResponse, error) {
		if b != r.pass {
			return b.ImageFsInfo(ctx, req)
		}
		ctx, cancel := context.WithTimeout(ctx, passthroughProbeTimeout)
		defer cancel()
		resp, err := b.ImageFsInfo(ctx, req)
		if isUnreachable(err) {
			r.log.Warn("image filesystems without the passthrough runtime's", "passthrough", r.passName, "err", err)
			return &runtimeapi.ImageFsInfoResponse{}, nil
		}
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ImageFsInfoResponse{
		ImageFilesystems:     mergeFilesystems(pass.GetImageFilesystems(), vm.GetImageFilesystems()),
		ContainerFilesystems: mergeFilesystems(pass.GetContainerFilesystems(), vm.GetContainerFilesystems()),
	}, nil
}

func mergeFilesystems(first, second []*runtimeapi.FilesystemUsage) []*runtimeapi.FilesystemUsage {
	out := make([]*runtimeapi.FilesystemUsage, 0, len(first)+len(second))
	for _, fs := range first {
		out = append(out, proto.CloneOf(fs))
	}
	for _, fs := range second {
		i := slices.IndexFunc(out, func(o *runtimeapi.FilesystemUsage) bool {
			return sameFilesystem(o.GetFsId().GetMountpoint(), fs.GetFsId().GetMountpoint())
		})
		if i < 0 {
			out = append(out, proto.CloneOf(fs))
			continue
		}
		o := out[i]
		o.Timestamp = max(o.GetTimestamp(), fs.GetTimestamp())
		o.UsedBytes = addUint64(o.GetUsedBytes(), fs.GetUsedBytes())
		o.InodesUsed = addUint64(o.GetInodesUsed(), fs.GetInodesUsed())
	}
	return out
}

func addUint64(a, b *runtimeapi.UInt64Value) *runtimeapi.UInt64Value {
	if a == nil && b == nil {
		return nil
	}
	return &runtimeapi.UInt64Value{Value: a.GetValue() + b.GetValue()}
}

// sameFilesystem reports whether two paths are on one device; a path that cannot be read is on
// none, so its usage is listed apart.
func sameFilesystem(a, b string) bool {
	var sa, sb syscall.Stat_t
	if a == "" || b == "" || syscall.Stat(a, &sa) != nil || syscall.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev
}

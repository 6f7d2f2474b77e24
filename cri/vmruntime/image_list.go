package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ListImages answers from the store; the filter names one image by reference or ID.
func (s *Runtime) ListImages(_ context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: s.listImages(req.GetFilter())}, nil
}

// StreamImages sends the same list as ListImages, in one message.
func (s *Runtime) StreamImages(req *runtimeapi.StreamImagesRequest, stream runtimeapi.ImageService_StreamImagesServer) error {
	return stream.Send(&runtimeapi.StreamImagesResponse{Images: s.listImages(req.GetFilter())})
}

func (s *Runtime) listImages(f *runtimeapi.ImageFilter) []*runtimeapi.Image {
	records := s.images.List(f.GetImage().GetImage())
	out := make([]*runtimeapi.Image, 0, len(records))
	for _, img := range records {
		out = append(out, criImage(img))
	}
	return out
}

func criImage(img *store.Image) *runtimeapi.Image {
	return &runtimeapi.Image{
		Id:          img.ID,
		RepoTags:    img.RepoTags,
		RepoDigests: img.RepoDigests,
		Size:        imageFsBytes(img),
		Spec:        &runtimeapi.ImageSpec{Image: img.ID},
	}
}

// imageFsBytes is an image's size as the kubelet's image GC counts it: what removing the image
// frees on the image filesystem (ImageFsInfo). A snapshot directory (a restored pod checkpoint's
// container) is its owner's, outside cocoon, and its removal frees none of it: counted, it would
// stop the GC before it had freed what the node needs. Its bytes are in the verbose status.
func imageFsBytes(img *store.Image) uint64 {
	if img.FromDir {
		return 0
	}
	return uint64(img.Size)
}

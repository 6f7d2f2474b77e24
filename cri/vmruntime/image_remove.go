package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RemoveImage drops the named reference, or every reference when given the image ID. The cocoon
// artifact is deleted when no reference is left and no container needs it; a clone that reads the
// snapshot's memory on demand keeps it until that container is removed. A warm pool whose reference
// no longer names the image is drained. A missing image succeeds.
func (s *Runtime) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalid("image is required")
	}
	img, _ := s.images.Get(ref)
	if err := s.images.Remove(ctx, ref); err != nil {
		return nil, err
	}
	if img != nil && s.drainPools(ctx, img.ID) {
		// The artifact was kept for the pool's VMs.
		if err := s.images.Sweep(ctx); err != nil {
			return nil, err
		}
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

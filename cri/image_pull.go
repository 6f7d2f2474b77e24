package cri

import (
	"context"
	"errors"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
)

// PullImage succeeds for an image already on the node. Pulling from a registry is not implemented
// yet: images are imported by the operator.
func (s *Server) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalid("image is required")
	}
	if _, err := imagestore.Normalize(ref); err != nil {
		return nil, toStatus(err)
	}
	img, err := s.images.Get(ref)
	if errors.Is(err, imagestore.ErrNotFound) {
		return nil, unimplemented("PullImage from a registry",
			"import the image on the node with cocoon-cri image import --ref "+ref+" FILE (a cocoon snapshot archive or a qcow2 cloud image), and set imagePullPolicy: IfNotPresent or Never")
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtimeapi.PullImageResponse{ImageRef: img.ID}, nil
}

package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
)

// PullImage resolves the image in its registry and brings it into cocoon: a snapshot, a cloud
// image or an OCI VM image, told apart by the manifest's artifactType (imagestore.Pull). The
// reply is the image ID, the digest of the manifest for this node's platform.
func (s *Runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalid("image is required")
	}
	img, err := s.images.Pull(ctx, ref, pullCredentials(req.GetAuth()))
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PullImageResponse{ImageRef: img.ID}, nil
}

// pullCredentials takes the registry credentials the kubelet (or crictl --creds/--auth) sent.
func pullCredentials(auth *runtimeapi.AuthConfig) imagestore.Credentials {
	return imagestore.Credentials{
		Username: auth.GetUsername(), Password: auth.GetPassword(), Auth: auth.GetAuth(),
		IdentityToken: auth.GetIdentityToken(), RegistryToken: auth.GetRegistryToken(),
	}
}

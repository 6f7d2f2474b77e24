package vmruntime

import (
	"context"
	"errors"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ImageStatus finds an image by reference, ID or ID prefix. A missing image is an empty answer,
// not an error: that is how the kubelet learns it has to pull.
func (s *Runtime) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalid("image is required")
	}
	img, err := s.images.Get(ref)
	if errors.Is(err, imagestore.ErrNotFound) {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.ImageStatusResponse{Image: criImage(img)}
	if req.GetVerbose() {
		info := imageInfo{Kind: img.Kind, LocalName: img.LocalName, FromDir: img.FromDir, Snapshot: img.Snapshot}
		if img.FromDir {
			info.DirBytes = img.Size
		}
		if resp.Info, err = verboseInfo(info); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// imageInfo is the verbose status: what the image is in cocoon.
type imageInfo struct {
	Kind      store.ImageKind `json:"kind"`
	LocalName string          `json:"localName"`
	// FromDir: LocalName is a snapshot directory outside cocoon (a pod checkpoint's container).
	FromDir bool `json:"fromDir,omitempty"`
	// DirBytes is what that directory's files take on disk, which the image's size leaves out
	// (imageFsBytes).
	DirBytes int64               `json:"dirBytes,omitempty"`
	Snapshot *store.SnapshotInfo `json:"snapshot,omitempty"`
}

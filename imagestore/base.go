package imagestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// ErrBaseUnavailable: a snapshot's base image is not on the node and could not be pulled.
var ErrBaseUnavailable = errdefs.ErrFailedPrecondition.WithMessage("the snapshot's base image is not on this node")

// ensureBase brings the image a snapshot's disks build on to the node, before the snapshot counts
// as pulled or imported. cocoon's `vm clone --pull` would fetch a missing base as well, but with
// only its own environment's credentials and, when that fails, only a warning: the node then
// learned at the pod's start, from a clone that could not find the base's files, what it could
// have said at the pull. Here the base comes with the pull's credentials (when it lives in the
// snapshot's registry), and a base that cannot be had fails the pull with cocoon's reason.
//
// A base that names no registry (an imported image, a Docker Hub short name) is left to the
// clone: there is nowhere to fetch it from that cocoon does not know better.
func (s *Service) ensureBase(ctx context.Context, img *store.Image, registry name.Registry, creds Credentials) error {
	snap := img.Snapshot
	if snap == nil || snap.BaseImage == "" || snap.ImageType == "" {
		return nil
	}
	_, err := s.cocoon.ImageInspect(ctx, cmp.Or(snap.BaseDigest, snap.BaseImage))
	if err == nil {
		return nil
	}
	if !errors.Is(err, cocoon.ErrNotFound) {
		return fmt.Errorf("look up the snapshot's base image %s: %w", snap.BaseImage, err)
	}
	ref, ok := basePullRef(snap)
	if !ok {
		s.log.Warn("the snapshot's base image is not on this node and names no registry to pull it from: "+
			"a clone of it fails unless the base's files are here", "image", img.ID, "base", snap.BaseImage)
		return nil
	}
	config, remove, err := dockerConfig(s.pullOpts.CredentialsDir, registry, creds)
	if err != nil {
		return err
	}
	defer remove()
	if _, err := s.cocoon.ImagePull(ctx, ref, cocoon.PullOptions{DockerConfig: config}); err != nil {
		return fmt.Errorf("%w: %s, and cocoon could not pull it: %w", ErrBaseUnavailable, ref, err)
	}
	s.log.Info("pulled the snapshot's base image", "image", img.ID, "base", ref)
	return nil
}

// basePullRef is what cocoon pulls a missing base by, as its own clone --pull would: an OCI
// image pinned to the recorded digest (repository@sha256:…), a cloud image by its URL. ok is
// false for a base that names no registry: an OCI reference without a registry host (its first
// component has no dot or port and is not localhost) or a cloud image that is no http(s) URL.
func basePullRef(snap *store.SnapshotInfo) (ref string, ok bool) {
	switch snap.ImageType {
	case cocoon.ImageTypeCloudImg:
		return snap.BaseImage, strings.HasPrefix(snap.BaseImage, "https://") || strings.HasPrefix(snap.BaseImage, "http://")
	case cocoon.ImageTypeOCI:
		host, _, found := strings.Cut(snap.BaseImage, "/")
		if !found || (!strings.ContainsAny(host, ".:") && host != "localhost") {
			return "", false
		}
		parsed, err := name.ParseReference(snap.BaseImage)
		if err != nil {
			return "", false
		}
		if snap.BaseDigest == "" {
			return parsed.String(), true
		}
		return parsed.Context().Digest(snap.BaseDigest).String(), true
	}
	return "", false
}

package imagestore

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// artifact is what a reference resolved to in its registry.
type artifact struct {
	ref name.Reference
	// resolved is the digest the reference names: an index's when it names an index.
	resolved v1.Hash
	// id is the digest of the image manifest for this node's platform: the image ID.
	id       string
	manifest *v1.Manifest
	kind     store.ImageKind
}

// resolve fetches the manifest ref names; an index gives way to its linux/<GOARCH> manifest.
func (rs *registrySession) resolve(ctx context.Context, ref name.Reference) (*artifact, error) {
	desc, err := rs.manifest(ctx, ref)
	if err != nil {
		return nil, err
	}
	art := &artifact{ref: ref, resolved: desc.Digest}
	if desc.MediaType.IsIndex() {
		index, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
		if err != nil {
			return nil, fmt.Errorf("parse index %s: %v: %w", ref, err, ErrInvalid)
		}
		child, err := platformManifest(index)
		if err != nil {
			return nil, fmt.Errorf("index %s: %w", ref, err)
		}
		if desc, err = rs.manifest(ctx, ref.Context().Digest(child.String())); err != nil {
			return nil, err
		}
	}
	if !desc.MediaType.IsImage() {
		return nil, fmt.Errorf("%s is a %s, not an image manifest: %w", ref, desc.MediaType, ErrInvalid)
	}
	if art.manifest, err = v1.ParseManifest(bytes.NewReader(desc.Manifest)); err != nil {
		return nil, fmt.Errorf("parse manifest %s: %v: %w", ref, err, ErrInvalid)
	}
	art.id = desc.Digest.String()
	art.kind = classify(art.manifest)
	return art, nil
}

// platformManifest picks the node's platform from an index: VMs run on the host's architecture.
func platformManifest(index *v1.IndexManifest) (v1.Hash, error) {
	for _, m := range index.Manifests {
		if p := m.Platform; p != nil && p.OS == "linux" && p.Architecture == runtime.GOARCH {
			return m.Digest, nil
		}
	}
	return v1.Hash{}, fmt.Errorf("no manifest for linux/%s: %w", runtime.GOARCH, ErrNotFound)
}

// classifyTimeout bounds the registry round trips of Classify: it runs before a pull is routed,
// and a registry that does not answer must not hold the pull up for long.
const classifyTimeout = 30 * time.Second

// Classify resolves ref in its registry and tells what it is (a cocoon snapshot, a cloud image, or
// an OCI image) without pulling anything.
func (s *Service) Classify(ctx context.Context, ref string, creds Credentials) (store.ImageKind, error) {
	ctx, cancel := context.WithTimeout(ctx, classifyTimeout)
	defer cancel()
	normalized, err := Normalize(ref)
	if err != nil {
		return "", err
	}
	remoteRef, err := s.registry.parse(normalized)
	if err != nil {
		return "", err
	}
	session, err := s.registry.connect(ctx, remoteRef.Context(), creds)
	if err != nil {
		return "", err
	}
	art, err := session.resolve(ctx, remoteRef)
	if err != nil {
		return "", err
	}
	return art.kind, nil
}

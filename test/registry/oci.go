package registry

import (
	"bytes"
	"context"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PushOCIImage pushes an ordinary OCI image for linux/amd64 under repoTag, each layer tar
// (testimage.WriteOCILayer) gzip-compressed, as any container tool would: what cocoon calls an OCI
// VM image.
func (t Target) PushOCIImage(ctx context.Context, repoTag string, layerTars ...[]byte) (Pushed, error) {
	ref, err := t.ref(repoTag)
	if err != nil {
		return Pushed{}, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, data := range layerTars {
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return Pushed{}, err
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return Pushed{}, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Pushed{}, err
	}
	cfg.OS, cfg.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return Pushed{}, err
	}
	if err := remote.Write(ref, img, t.options(ctx)...); err != nil {
		return Pushed{}, fmt.Errorf("push %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return Pushed{}, err
	}
	return Pushed{Ref: ref.String(), Digest: digest.String()}, nil
}

// IndexEntry is a manifest of the repository (by digest) and the platform an index gives it.
type IndexEntry struct {
	OS, Architecture string
	Digest           string
}

// PushIndex pushes an OCI image index under repoTag with the entries in the order given.
func (t Target) PushIndex(ctx context.Context, repoTag string, entries ...IndexEntry) (Pushed, error) {
	ref, err := t.ref(repoTag)
	if err != nil {
		return Pushed{}, err
	}
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, e := range entries {
		desc, err := remote.Head(ref.Context().Digest(e.Digest), t.options(ctx)...)
		if err != nil {
			return Pushed{}, fmt.Errorf("index entry %s: %w", e.Digest, err)
		}
		index.Manifests = append(index.Manifests, v1.Descriptor{
			MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size,
			Platform: &v1.Platform{OS: e.OS, Architecture: e.Architecture},
		})
	}
	pushed := Pushed{Ref: ref.String()}
	pushed.Digest, err = t.putManifest(ctx, ref, index, types.OCIImageIndex)
	return pushed, err
}

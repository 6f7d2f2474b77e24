package cocoonsim

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"
)

// imagePull is "image pull [--force] IMAGE...": an http(s):// URL is a cloud image download, any
// other argument an OCI reference (cmd/images/pull.go). Each is idempotent; logs go to stderr,
// only a cloud image's download progress to stdout.
func (a *app) imagePull(cmd *cobra.Command, args []string) error {
	oci, cloudimg, err := a.imageBackends()
	if err != nil {
		return err
	}
	force, _ := cmd.Flags().GetBool("force")
	for _, image := range args {
		if strings.HasPrefix(image, "http://") || strings.HasPrefix(image, "https://") {
			err = a.pullCloudimg(cmd, cloudimg, image, force)
		} else {
			err = a.pullOCI(cmd.Context(), oci, image)
		}
		if err != nil {
			return fmt.Errorf("pull %s: %w", image, err)
		}
	}
	return nil
}

// pullOCI pulls an image as cocoon's images/oci does: go-containerregistry with the docker
// keychain (plain HTTP only where go-containerregistry allows it, e.g. loopback), platform
// linux/<GOARCH>, every layer converted by mkfs.erofs, all under the index lock. The simulator
// keeps the layer tar as the blob, keyed by the layer digest as cocoon keys its EROFS blob.
func (a *app) pullOCI(ctx context.Context, store *ociStore, image string) error {
	logger := a.log.with("cmd.images.pullOCI")
	parsed, err := name.ParseReference(image)
	if err != nil {
		return fmt.Errorf("invalid image reference %q: %w", image, err)
	}
	ref := parsed.String()
	img, err := remote.Image(parsed,
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return fmt.Errorf("fetch image %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("get manifest digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("get layers: %w", err)
	}
	if len(layers) == 0 {
		return fmt.Errorf("image %s has no layers", ref)
	}
	return store.db.Update(ctx, func(idx *ociIndex) error {
		if store.upToDate(idx, ref, digest.String()) {
			return nil
		}
		logger.Infof("pulling OCI image %s (%d layers)", image, len(layers))
		workDir, err := os.MkdirTemp(store.dirs.tempDir(), "pull-*")
		if err != nil {
			return fmt.Errorf("create work dir: %w", err)
		}
		defer os.RemoveAll(workDir) //nolint:errcheck
		results := make([]layerResult, len(layers))
		for i, layer := range layers {
			if results[i], err = store.pullLayer(ctx, layer, workDir, i); err != nil {
				return fmt.Errorf("process layers: %w", err)
			}
			logger.Infof("[%d/%d] %s done", i+1, len(layers), results[i].hex[:12])
		}
		logger.Infof("committing...")
		if err := store.commit(idx, ref, digest.String(), results); err != nil {
			return err
		}
		logger.Infof("done: %s", image)
		return nil
	})
}

// pullLayer converts one layer, or takes its blob and boot files from an earlier pull.
func (s *ociStore) pullLayer(ctx context.Context, layer v1.Layer, workDir string, i int) (layerResult, error) {
	digest, err := layer.Digest()
	if err != nil {
		return layerResult{}, fmt.Errorf("get digest: %w", err)
	}
	if blob := s.dirs.blobPath(digest.Hex); validFile(blob) {
		res := layerResult{hex: digest.Hex, tar: blob}
		if validFile(s.kernelPath(digest.Hex)) {
			res.kernel = s.kernelPath(digest.Hex)
		}
		if validFile(s.initrdPath(digest.Hex)) {
			res.initrd = s.initrdPath(digest.Hex)
		}
		return res, nil
	}
	rc, err := layer.Uncompressed()
	if err != nil {
		return layerResult{}, fmt.Errorf("open uncompressed layer: %w", err)
	}
	defer rc.Close() //nolint:errcheck
	res, err := s.processLayer(ctx, rc, workDir, i, true)
	if err != nil {
		return layerResult{}, err
	}
	res.hex = digest.Hex
	return res, nil
}

// upToDate reports a pull cocoon skips: the reference has this manifest and every file is there.
func (s *ociStore) upToDate(idx *ociIndex, ref, digest string) bool {
	e := idx.Images[ref]
	if e == nil || e.ManifestDigest != digest {
		return false
	}
	if !validFile(s.kernelPath(digestHex(e.KernelLayer))) || !validFile(s.initrdPath(digestHex(e.InitrdLayer))) {
		return false
	}
	for _, l := range e.Layers {
		if !validFile(s.dirs.blobPath(digestHex(l.Digest))) {
			return false
		}
	}
	return true
}

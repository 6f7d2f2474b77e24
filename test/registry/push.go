package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Target is a registry to push to.
type Target struct {
	// Host is host:port; loopback registries are spoken to over plain HTTP.
	Host string
	// Transport makes the connections; nil is Go's default.
	Transport http.RoundTripper
	// Auth is nil for anonymous pushes.
	Auth authn.Authenticator
}

// Pushed is what a push left in the registry.
type Pushed struct {
	// Ref is host/repo:tag.
	Ref string
	// Digest is the manifest's (or index's) digest.
	Digest string
	// Blobs are the layer digests by layer title (for cloud images and snapshots).
	Blobs map[string]string
}

// DigestRef is the pushed manifest's reference by digest: host/repo@sha256:....
func (p Pushed) DigestRef() string {
	ref, _ := name.ParseReference(p.Ref)
	return ref.Context().Digest(p.Digest).String()
}

func (t Target) options(ctx context.Context) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx)}
	if t.Transport != nil {
		opts = append(opts, remote.WithTransport(t.Transport))
	}
	if t.Auth != nil {
		opts = append(opts, remote.WithAuth(t.Auth))
	}
	return opts
}

func (t Target) ref(repoTag string) (name.Reference, error) {
	return name.ParseReference(t.Host + "/" + repoTag)
}

// blob is a blob to upload, read from a file or from memory.
type blob struct {
	mediaType types.MediaType
	digest    v1.Hash
	size      int64
	open      func() (io.ReadCloser, error)
}

// The methods make blob a partial.CompressedLayer: go-containerregistry uploads it as it is.
func (b *blob) Digest() (v1.Hash, error)            { return b.digest, nil }
func (b *blob) Compressed() (io.ReadCloser, error)  { return b.open() }
func (b *blob) Size() (int64, error)                { return b.size, nil }
func (b *blob) MediaType() (types.MediaType, error) { return b.mediaType, nil }
func (b *blob) descriptor() v1.Descriptor {
	return v1.Descriptor{MediaType: b.mediaType, Digest: b.digest, Size: b.size}
}
func (b *blob) withTitle(title string) v1.Descriptor {
	d := b.descriptor()
	d.Annotations = map[string]string{titleAnnotation: title}
	return d
}

func bytesBlob(mediaType types.MediaType, data []byte) *blob {
	sum := sha256.Sum256(data)
	return &blob{
		mediaType: mediaType, size: int64(len(data)),
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])},
		open:   func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
	}
}

// spoolBlob copies r to a temporary file, as epoch's pusher buffers each tar entry, so a large
// blob is never in memory. The file goes when the push does.
func spoolBlob(mediaType types.MediaType, r io.Reader, dir string) (*blob, error) {
	f, err := os.CreateTemp(dir, "blob-*")
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck
	hash := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, hash), r)
	if err != nil {
		return nil, err
	}
	path := f.Name()
	return &blob{
		mediaType: mediaType, size: n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(hash.Sum(nil))},
		open:   func() (io.ReadCloser, error) { return os.Open(path) }, //nolint:gosec // the spool file
	}, nil
}

func (t Target) pushBlob(ctx context.Context, repo name.Repository, b *blob) error {
	layer, err := partial.CompressedToLayer(b)
	if err != nil {
		return err
	}
	if err := remote.WriteLayer(repo, layer, t.options(ctx)...); err != nil {
		return fmt.Errorf("push blob %s: %w", b.digest, err)
	}
	return nil
}

// rawManifest is a manifest pushed byte for byte as given.
type rawManifest struct {
	data      []byte
	mediaType types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.data, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mediaType, nil }

// putManifest uploads a manifest (marshalled with indentation, as epoch does) under ref and
// returns its digest.
func (t Target) putManifest(ctx context.Context, ref name.Reference, manifest any, mediaType types.MediaType) (string, error) {
	data, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		return "", err
	}
	if err := remote.Put(ref, rawManifest{data: data, mediaType: mediaType}, t.options(ctx)...); err != nil {
		return "", fmt.Errorf("put manifest %s: %w", ref, err)
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Tag puts the pushed manifest under one more tag of its repository.
func (t Target) Tag(ctx context.Context, pushed Pushed, tag string) error {
	ref, err := name.ParseReference(pushed.DigestRef())
	if err != nil {
		return err
	}
	desc, err := remote.Get(ref, t.options(ctx)...)
	if err != nil {
		return err
	}
	return remote.Tag(ref.Context().Tag(tag), desc, t.options(ctx)...)
}

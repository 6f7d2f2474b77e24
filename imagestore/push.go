package imagestore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
)

// PushOptions configure Push.
type PushOptions struct {
	// Insecure and CAFile reach the registry as pulls do (PullOptions): TLS with the system roots
	// and the CA file, plain HTTP only to loopback and the insecure registries.
	Insecure []string
	CAFile   string
	// Credentials authenticate the push. When they are empty, Keychain, when set, is asked for the
	// credentials of the reference's registry (authn.DefaultKeychain reads the docker config); they
	// go to that registry only. Neither: anonymous.
	Credentials Credentials
	Keychain    authn.Keychain
	// OnFile, when set, is told of each file of the snapshot as its upload starts.
	OnFile func(name string, size int64)
}

// PushResult is what a push left in the registry.
type PushResult struct {
	// Ref is the tag pushed, normalized (docker.io/library/name:latest for a bare name).
	Ref string
	// Digest is the manifest's: the image ID a pull of Ref gets.
	Digest string
	// Checkpoint is the metadata of a checkpoint archive, now the manifest's AnnotationCheckpoint;
	// nil for a plain snapshot export.
	Checkpoint *checkpoint.Metadata
	// Files is how many files the snapshot has, Bytes their size together.
	Files int
	Bytes int64
	// Uncarried names the settings of snapshot.json the artifact format has no field for: a pull
	// of Ref has cocoon's defaults for them.
	Uncarried []string
}

// DigestRef is the tag with the manifest's digest, which names exactly what was pushed.
func (r *PushResult) DigestRef() string { return r.Ref + "@" + r.Digest }

// Push pushes a snapshot to a registry under ref, as the artifact a pull brings back as the same
// snapshot (epoch's format, docs/images.md): a config blob with snapshot.json's description and
// each file's mode and sparse records, and one layer per file, titled with its name, in archive
// order. The snapshot at path is an archive file: what `cocoon snapshot export` writes, plain or
// gzip-compressed, or a checkpoint archive (pkg/checkpoint), whose metadata becomes the manifest's
// AnnotationCheckpoint rather than a file of the snapshot. Or it is a snapshot directory, as
// `cocoon snapshot export --to-dir` writes it, pushed as the archive cocoon would export of it;
// the container's directory of a pod checkpoint has its metadata from the checkpoint's PodFile.
//
// The reference and the whole snapshot are checked before anything is sent: a bad reference, a
// missing file or one that is not a snapshot pushes nothing. Blobs the repository already
// holds are not sent again; the manifest is put last, so a push that fails leaves no tag.
func Push(ctx context.Context, path, ref string, opts PushOptions) (*PushResult, error) {
	tag, err := NormalizeTag(ref)
	if err != nil {
		return nil, err
	}
	rc, err := newRegistryClient(opts.Insecure, opts.CAFile)
	if err != nil {
		return nil, err
	}
	remoteRef, err := rc.parse(tag)
	if err != nil {
		return nil, err
	}
	scan, err := scanPushSource(path)
	if err != nil {
		return nil, err
	}
	defer scan.close() //nolint:errcheck // read only
	art, err := scan.artifact()
	if err != nil {
		return nil, err
	}

	repo := remoteRef.Context()
	auth, err := opts.authenticator(ctx, repo)
	if err != nil {
		return nil, err
	}
	pusher, err := remote.NewPusher(remote.WithAuth(auth), remote.WithTransport(rc.base), remote.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	result := &PushResult{Ref: tag, Checkpoint: scan.checkpoint, Files: len(scan.files), Uncarried: uncarried(scan.export.Config)}
	// One at a time, in archive order: a gzipped archive is then decompressed once more in all.
	for _, f := range scan.files {
		if opts.OnFile != nil {
			opts.OnFile(f.name, f.size)
		}
		layer, err := partial.CompressedToLayer(&pushBlob{
			mediaType: snapshotFileMediaType(f.name), digest: f.digest, size: f.size, open: f.open,
		})
		if err == nil {
			err = pusher.Upload(ctx, repo, layer)
		}
		if err != nil {
			return nil, registryError(repo.RegistryStr(), fmt.Errorf("push %s: %w", f.name, err))
		}
		result.Bytes += f.size
	}
	configLayer, err := partial.CompressedToLayer(&pushBlob{
		mediaType: art.configDesc.MediaType, digest: art.configDesc.Digest, size: art.configDesc.Size,
		open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(art.config)), nil },
	})
	if err == nil {
		err = pusher.Upload(ctx, repo, configLayer)
	}
	if err != nil {
		return nil, registryError(repo.RegistryStr(), fmt.Errorf("push the snapshot config: %w", err))
	}
	if err := pusher.Put(ctx, remoteRef, rawManifest(art.manifest)); err != nil {
		return nil, registryError(repo.RegistryStr(), fmt.Errorf("put manifest %s: %w", remoteRef, err))
	}
	result.Digest = art.digest.String()
	return result, nil
}

func (o PushOptions) authenticator(ctx context.Context, repo name.Repository) (authn.Authenticator, error) {
	if o.Credentials != (Credentials{}) || o.Keychain == nil {
		return o.Credentials.authenticator(), nil
	}
	auth, err := authn.Resolve(ctx, o.Keychain, repo)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s: %w", repo.RegistryStr(), err)
	}
	return auth, nil
}

// pushArtifact is a snapshot's config blob and manifest, as they are pushed.
type pushArtifact struct {
	config     []byte
	configDesc v1.Descriptor
	manifest   []byte
	digest     v1.Hash
}

// artifact makes the config blob and the manifest of the scanned snapshot.
func (s *scannedSnapshot) artifact() (*pushArtifact, error) {
	files := make(map[string]snapshotFile, len(s.files))
	layers := make([]v1.Descriptor, 0, len(s.files))
	for _, f := range s.files {
		files[f.name] = f.record
		layers = append(layers, v1.Descriptor{
			MediaType: snapshotFileMediaType(f.name), Digest: f.digest, Size: f.size,
			Annotations: map[string]string{annotationTitle: f.name},
		})
	}
	art := &pushArtifact{}
	var err error
	if art.config, err = json.Marshal(newSnapshotConfig(s.export.Config, files, s.created)); err != nil {
		return nil, fmt.Errorf("encode the snapshot config: %w", err)
	}
	art.configDesc = v1.Descriptor{MediaType: mediaTypeSnapshotConfig}
	if art.configDesc.Digest, art.configDesc.Size, err = v1.SHA256(bytes.NewReader(art.config)); err != nil {
		return nil, err
	}
	annotations := map[string]string{annotationCreated: s.created.UTC().Format(time.RFC3339)}
	if s.checkpoint != nil {
		md, err := json.Marshal(s.checkpoint)
		if err != nil {
			return nil, fmt.Errorf("encode the checkpoint metadata: %w", err)
		}
		annotations[AnnotationCheckpoint] = string(md)
	}
	art.manifest, err = json.Marshal(v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  artifactTypeSnapshot,
		Config:        art.configDesc,
		Layers:        layers,
		Annotations:   annotations,
	})
	if err != nil {
		return nil, fmt.Errorf("encode the manifest: %w", err)
	}
	if art.digest, _, err = v1.SHA256(bytes.NewReader(art.manifest)); err != nil {
		return nil, err
	}
	return art, nil
}

// pushBlob is a blob whose digest is known before it is read: go-containerregistry uploads it as
// it is (a partial.CompressedLayer, though nothing is compressed). open may be called again when
// an upload is retried.
type pushBlob struct {
	mediaType types.MediaType
	digest    v1.Hash
	size      int64
	open      func() (io.ReadCloser, error)
}

func (b *pushBlob) Digest() (v1.Hash, error)            { return b.digest, nil }
func (b *pushBlob) Size() (int64, error)                { return b.size, nil }
func (b *pushBlob) MediaType() (types.MediaType, error) { return b.mediaType, nil }
func (b *pushBlob) Compressed() (io.ReadCloser, error)  { return b.open() }

// rawManifest is a manifest put byte for byte.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

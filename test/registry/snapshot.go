package registry

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// SnapshotPush tunes PushSnapshot.
type SnapshotPush struct {
	// CreatedAt is the config's creation time; zero is now, as epoch does.
	CreatedAt time.Time
	// Files overrides the config's per-file records (mode, sparse map) by title: for tests of what
	// a bad one does.
	Files map[string]FileRecord
}

// FileRecord is what a snapshot's config records of one file.
type FileRecord struct {
	Mode       int64
	SparseMap  string
	SparseSize int64
}

// PushSnapshot pushes a snapshot archive (as `cocoon snapshot export` writes it) under repoTag the
// way `epoch push` does: one layer per data file, titled with its name and typed by it, and a
// config blob holding snapshot.json's description and each file's mode and sparse records.
func (t Target) PushSnapshot(ctx context.Context, repoTag string, archive io.Reader, opts SnapshotPush) (Pushed, error) {
	ref, err := t.ref(repoTag)
	if err != nil {
		return Pushed{}, err
	}
	spool, err := os.MkdirTemp("", "snapshot-push-")
	if err != nil {
		return Pushed{}, err
	}
	defer os.RemoveAll(spool) //nolint:errcheck

	pushed := Pushed{Ref: ref.String(), Blobs: map[string]string{}}
	var export *cocoon.SnapshotExport
	files := map[string]epochSnapshotFile{}
	var layers []epochDescriptor
	tr := tar.NewReader(archive)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Pushed{}, fmt.Errorf("read archive: %w", err)
		}
		if hdr.Name == snapshotJSON {
			export = &cocoon.SnapshotExport{}
			if err := json.NewDecoder(tr).Decode(export); err != nil {
				return Pushed{}, fmt.Errorf("read %s: %w", snapshotJSON, err)
			}
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := spoolBlob(snapshotFileMediaType(hdr.Name), tr, spool)
		if err != nil {
			return Pushed{}, err
		}
		if err := t.pushBlob(ctx, ref.Context(), b); err != nil {
			return Pushed{}, err
		}
		file, err := fileRecord(hdr)
		if err != nil {
			return Pushed{}, err
		}
		files[hdr.Name] = file
		layers = append(layers, b.epochDescriptor(hdr.Name))
		pushed.Blobs[hdr.Name] = b.digest.String()
	}
	if export == nil {
		return Pushed{}, fmt.Errorf("the archive has no %s", snapshotJSON)
	}
	for title, f := range opts.Files {
		files[title] = epochSnapshotFile(f)
	}
	createdAt := opts.CreatedAt
	if createdAt.IsZero() {
		createdAt = time.Now()
	}
	config, err := snapshotConfigBlob(export.Config, files, createdAt)
	if err != nil {
		return Pushed{}, err
	}
	if err := t.pushBlob(ctx, ref.Context(), config); err != nil {
		return Pushed{}, err
	}
	pushed.Digest, err = t.putManifest(ctx, ref, epochManifest{
		SchemaVersion: 2,
		MediaType:     string(types.OCIManifestSchema1),
		ArtifactType:  artifactTypeSnapshot,
		Config:        config.epochDescriptor(""),
		Layers:        layers,
		Annotations:   map[string]string{createdAnnotation: createdAt.UTC().Format(time.RFC3339)},
	}, types.OCIManifestSchema1)
	return pushed, err
}

// fileRecord is what epoch keeps of a tar entry's header.
func fileRecord(hdr *tar.Header) (epochSnapshotFile, error) {
	f := epochSnapshotFile{Mode: hdr.Mode}
	sparseMap, ok := hdr.PAXRecords[paxSparseMap]
	if !ok {
		return f, nil
	}
	size, err := strconv.ParseInt(hdr.PAXRecords[paxSparseSize], 10, 64)
	if err != nil {
		return f, fmt.Errorf("sparse size of %s: %w", hdr.Name, err)
	}
	f.SparseMap, f.SparseSize = sparseMap, size
	return f, nil
}

func snapshotConfigBlob(c cocoon.SnapshotConfig, files map[string]epochSnapshotFile, createdAt time.Time) (*blob, error) {
	data, err := json.Marshal(epochSnapshotConfig{
		SchemaVersion: "v1", SnapshotID: c.ID, Description: c.Description, Image: c.Image,
		ImageDigest: c.ImageDigest, ImageType: c.ImageType, ImageBlobIDs: c.ImageBlobIDs,
		Hypervisor: c.Hypervisor, CPU: c.CPU, Memory: c.Memory, Storage: c.Storage, NICs: c.NICs,
		Network: c.Network, Windows: c.Windows, Files: files, CreatedAt: createdAt.UTC(),
	})
	if err != nil {
		return nil, err
	}
	return bytesBlob(mediaTypeSnapshotConfig, data), nil
}

package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// cocoon's PAX records of a sparse file: the data segments the entry holds, and the file's size.
const (
	paxSparseMap  = "COCOON.sparse.map"
	paxSparseSize = "COCOON.sparse.size"
)

// fetchSnapshotConfig downloads and reads a snapshot's config blob.
func fetchSnapshotConfig(ctx context.Context, blobs blobOpener, desc v1.Descriptor, counter io.Writer) (*snapshotConfig, error) {
	if desc.MediaType != mediaTypeSnapshotConfig {
		return nil, fmt.Errorf("snapshot config has media type %q, not %s: %w", desc.MediaType, mediaTypeSnapshotConfig, ErrInvalid)
	}
	if desc.Size > maxConfigSize {
		return nil, fmt.Errorf("snapshot config of %d bytes is larger than %d: %w", desc.Size, maxConfigSize, ErrInvalid)
	}
	var buf bytes.Buffer
	if err := copyBlob(ctx, &buf, blobs, desc, counter); err != nil {
		return nil, err
	}
	var cfg snapshotConfig
	if err := json.Unmarshal(buf.Bytes(), &cfg); err != nil {
		return nil, fmt.Errorf("snapshot config %s: %v: %w", desc.Digest, err, ErrInvalid)
	}
	return &cfg, nil
}

// writeSnapshotArchive rebuilds the archive `cocoon snapshot export` wrote from a snapshot
// artifact, as epoch's pull does: snapshot.json first (the config blob's description under the
// local name), then one entry per layer in manifest order, with the mode and the sparse PAX records
// the config's files map kept. Every entry has the artifact's creation time, so the archive is a
// function of the artifact alone.
func writeSnapshotArchive(ctx context.Context, w io.Writer, localName string, cfg *snapshotConfig, layers []v1.Descriptor, blobs blobOpener, counter io.Writer) error {
	modTime := cfg.CreatedAt
	if modTime.IsZero() {
		modTime = time.Unix(0, 0)
	}
	meta, err := json.MarshalIndent(cocoon.SnapshotExport{Config: cfg.exportConfig(localName), Version: cocoon.SnapshotExportVersion}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", snapshotManifest, err)
	}
	meta = append(meta, '\n')

	bw := bufio.NewWriterSize(w, 256<<10)
	tw := tar.NewWriter(bw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: snapshotManifest, Mode: 0o644, Size: int64(len(meta)), ModTime: modTime}); err != nil {
		return err
	}
	if _, err := tw.Write(meta); err != nil {
		return err
	}
	for _, layer := range layers {
		hdr, err := snapshotEntryHeader(layer, cfg.Files[title(layer)], modTime)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if err := copyBlob(ctx, tw, blobs, layer, counter); err != nil {
			return fmt.Errorf("snapshot file %s: %w", hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// snapshotEntryHeader is the tar header of the file a snapshot layer holds.
func snapshotEntryHeader(layer v1.Descriptor, file snapshotFile, modTime time.Time) (*tar.Header, error) {
	name := title(layer)
	if !plainFileName(name) {
		return nil, fmt.Errorf("snapshot layer %s has the title %q, not a file name: %w", layer.Digest, name, ErrInvalid)
	}
	if file.SparseMap != "" && file.SparseSize <= 0 {
		return nil, fmt.Errorf("snapshot file %s has a sparse map but no sparse size: %w", name, ErrInvalid)
	}
	return entryHeader(name, layer.Size, file, modTime), nil
}

// entryHeader is the tar header of a snapshot's file in cocoon's archive: size bytes of it follow,
// its data segments alone when it has sparse records. The mode may come from a registry: only
// permission bits pass, never setuid, setgid or sticky, whatever cocoon's extractor would make of
// them.
func entryHeader(name string, size int64, file snapshotFile, modTime time.Time) *tar.Header {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: cmp.Or(file.Mode&0o777, 0o640), ModTime: modTime}
	if file.SparseMap != "" {
		hdr.PAXRecords = map[string]string{paxSparseMap: file.SparseMap, paxSparseSize: strconv.FormatInt(file.SparseSize, 10)}
	}
	return hdr
}

package imagestore

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/sparse"
)

// scanPushSource reads what Push was given through once: a snapshot directory, or an archive.
func scanPushSource(path string) (*scannedSnapshot, error) {
	path, err := PodCheckpointEntry(path)
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if info.IsDir() {
		scan, err := scanSnapshotDir(path, true)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return scan, nil
	}
	src, err := openArchive(path)
	if err != nil {
		return nil, err
	}
	scan, err := scanArchive(src)
	if err != nil {
		src.Close() //nolint:errcheck // read only
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return scan, nil
}

// scanSnapshotDir reads a snapshot directory as `cocoon snapshot export --to-dir` writes it:
// snapshot.json and the snapshot's files beside it, flat. Each file is taken as cocoon's export
// archives it, in name order, a sparse one as its data segments with cocoon's sparse records, and
// hashed when asked (a push names each file by its digest); only those records and the segments
// are kept. The container's directory of a pod checkpoint has the checkpoint's metadata from the
// checkpoint's PodFile.
func scanSnapshotDir(dir string, hash bool) (*scannedSnapshot, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	switch pc, err := checkpoint.ReadPod(dir); {
	case err == nil:
		return nil, wholePodCheckpoint(dir, pc)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	scan := &scannedSnapshot{close: func() error { return nil }}
	if scan.checkpoint, err = podCheckpointOf(dir); err != nil {
		return nil, err
	}
	if err := scan.readSnapshotJSONFile(filepath.Join(dir, snapshotManifest)); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		switch {
		case e.Name() == snapshotManifest:
			continue
		case !e.Type().IsRegular():
			return nil, fmt.Errorf("%s is not a regular file (%s); a snapshot directory holds files only: %w", e.Name(), e.Type(), ErrInvalid)
		case !plainFileName(e.Name()):
			return nil, fmt.Errorf("%q is not a file name a snapshot artifact can carry: %w", e.Name(), ErrInvalid)
		}
		file, err := scanDirFile(filepath.Join(dir, e.Name()), hash)
		if err != nil {
			return nil, err
		}
		scan.files = append(scan.files, file)
	}
	return scan, nil
}

// readSnapshotJSONFile reads a directory's snapshot.json, and keeps it as it is.
func (s *scannedSnapshot) readSnapshotJSONFile(path string) error {
	f, err := os.Open(path) //nolint:gosec // the snapshot directory the user names
	if err != nil {
		return fmt.Errorf("not a cocoon snapshot directory: %v: %w", err, ErrInvalid)
	}
	defer f.Close() //nolint:errcheck // read only
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: %w", snapshotManifest, ErrInvalid)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxSnapshotJSON+1))
	if err != nil {
		return err
	}
	s.snapshotJSON = raw
	return s.decodeSnapshotJSON(info.Mode().IsRegular(), int64(len(raw)), info.ModTime(), bytes.NewReader(raw))
}

// scanDirFile takes one file of a snapshot directory as cocoon's export archives it: whole, or,
// when it has holes, its data segments, with the map and the file's size as its sparse records;
// and hashes those bytes when asked.
func scanDirFile(path string, hash bool) (scannedFile, error) {
	f, err := os.Open(path) //nolint:gosec // a file of the snapshot directory the user names
	if err != nil {
		return scannedFile{}, err
	}
	defer f.Close() //nolint:errcheck // read only
	info, err := f.Stat()
	if err != nil {
		return scannedFile{}, err
	}
	file := scannedFile{name: filepath.Base(path), size: info.Size(), record: snapshotFile{Mode: int64(info.Mode().Perm())}}
	segments := []sparse.Segment{{Offset: 0, Length: info.Size()}}
	if info.Size() > 0 {
		scanned, err := sparse.DataSegments(f, info.Size())
		if err != nil {
			return scannedFile{}, fmt.Errorf("%s: %w", path, err)
		}
		if sparse.Bytes(scanned) < info.Size() {
			sparseMap, err := json.Marshal(scanned)
			if err != nil {
				return scannedFile{}, err
			}
			segments, file.size = scanned, sparse.Bytes(scanned)
			file.record.SparseMap, file.record.SparseSize = string(sparseMap), info.Size()
		}
	}
	if hash {
		h := sha256.New()
		if n, err := io.Copy(h, sparse.Reader(f, segments)); err != nil || n != file.size {
			return scannedFile{}, fmt.Errorf("read %s (%d of %d bytes): %v: %w", path, n, file.size, err, ErrInvalid)
		}
		file.digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	}
	file.open = func() (io.ReadCloser, error) {
		f, err := os.Open(path) //nolint:gosec // as above
		if err != nil {
			return nil, err
		}
		return struct {
			io.Reader
			io.Closer
		}{sparse.Reader(f, segments), f}, nil
	}
	return file, nil
}

// podCheckpointOf is the metadata of the container whose snapshot directory is dir, from the pod
// checkpoint that holds it; nil for a directory in no pod checkpoint.
func podCheckpointOf(dir string) (*checkpoint.Metadata, error) {
	parent := filepath.Dir(dir)
	pc, err := checkpoint.ReadPod(parent)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	for _, m := range pc.Containers {
		if m.Snapshot != filepath.Base(dir) {
			continue
		}
		if m.Metadata == nil || m.Metadata.Version != checkpoint.FormatVersion {
			return nil, fmt.Errorf("%s has no checkpoint metadata of version %d for container %q: %w", filepath.Join(parent, checkpoint.PodFile), checkpoint.FormatVersion, m.Name, ErrInvalid)
		}
		return m.Metadata, nil
	}
	return nil, fmt.Errorf("the pod checkpoint %s does not hold this directory as a container's: %w", parent, ErrInvalid)
}

// PodCheckpointEntry is what of path a push or an import takes: path itself, unless it is a pod
// checkpoint directory (CheckpointPod's output_path), whose one container's entry, its snapshot
// directory or archive, it then is. A pod checkpoint of several containers is refused, naming
// each entry: they are images of their own.
func PodCheckpointEntry(path string) (string, error) {
	pc, err := checkpoint.ReadPod(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return path, nil
	case err != nil:
		return "", fmt.Errorf("%w: %w", err, ErrInvalid)
	case len(pc.Containers) > 1:
		return "", wholePodCheckpoint(path, pc)
	}
	m := pc.Containers[0]
	entry := m.Snapshot + m.Archive
	if (m.Snapshot == "") == (m.Archive == "") || !plainFileName(entry) {
		return "", fmt.Errorf("%s: container %q names no entry of the directory: %w", filepath.Join(path, checkpoint.PodFile), m.Name, ErrInvalid)
	}
	return filepath.Join(path, entry), nil
}

// wholePodCheckpoint refuses a whole pod checkpoint as one image, naming what of it can be one:
// each container's directory or archive, which a pod runs as its image.
func wholePodCheckpoint(dir string, pc *checkpoint.PodCheckpoint) error {
	var entries []string
	for _, m := range pc.Containers {
		entries = append(entries, fmt.Sprintf("%s (container %s)", filepath.Join(dir, m.Snapshot+m.Archive), m.Name))
	}
	return fmt.Errorf("a whole pod checkpoint; give each container's checkpoint, under a reference of its own: %s: %w", strings.Join(entries, ", "), ErrInvalid)
}

// WriteSnapshotDir writes the archive cocoon's export would write of a snapshot directory (cocoon's
// snapshot export --to-dir): snapshot.json as it is, then the files in name order, sparse ones as
// cocoon's sparse entries, every entry dated with snapshot.json's time, so that the same directory
// gives the same bytes. The container's directory of a pod checkpoint gives that container's
// checkpoint archive (pkg/checkpoint), its metadata from the checkpoint's PodFile. What
// `cocoon-cri image import` sends of a directory; the directory is only read.
func WriteSnapshotDir(w io.Writer, dir string) error {
	scan, err := scanSnapshotDir(dir, false)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	export := func(w io.Writer) error {
		tw := tar.NewWriter(w)
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: snapshotManifest, Mode: 0o644, Size: int64(len(scan.snapshotJSON)), ModTime: scan.created}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(scan.snapshotJSON); err != nil {
			return err
		}
		for _, f := range scan.files {
			if err := tw.WriteHeader(entryHeader(f.name, f.size, f.record, scan.created)); err != nil {
				return err
			}
			if err := copyFileData(tw, f); err != nil {
				return err
			}
		}
		return tw.Close()
	}
	if scan.checkpoint != nil {
		return checkpoint.Write(w, scan.checkpoint, export)
	}
	return export(w)
}

// copyFileData copies what a scanned file's entry holds.
func copyFileData(w io.Writer, f scannedFile) error {
	r, err := f.open()
	if err != nil {
		return err
	}
	defer r.Close() //nolint:errcheck // read only
	if n, err := io.Copy(w, r); err != nil || n != f.size {
		return fmt.Errorf("read %s (%d of %d bytes, has it changed?): %v", f.name, n, f.size, err)
	}
	return nil
}

package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// A push reads its archive twice: once to check it and hash each file (scanArchive), then once
// more to upload each file (archiveSource.entry) from where the first read found it. Spooling
// each file to a temporary file instead would write the snapshot's memory and disk, GiBs, a
// second time, to a directory that is often a tmpfs (RAM) or too small; the second read costs
// nothing for a plain tar, which is read in place, and one more decompression for a gzipped one.
// What the registry receives is checked against the first read's digests by the registry itself,
// so an archive that changed in between fails the push rather than corrupting it.

// gzipMagic starts a gzip stream.
var gzipMagic = []byte{0x1f, 0x8b}

// maxSnapshotJSON bounds snapshot.json, a few KiB.
const maxSnapshotJSON = 1 << 20

// archiveSource is a snapshot or checkpoint archive file, gzip-compressed or not, read by offsets
// in its tar stream (the decompressed one for a gzipped file).
type archiveSource struct {
	f       *os.File
	gzipped bool

	mu sync.Mutex
	// spare is a decompressing reader left where the last entry read from it stopped: entries
	// read in archive order decompress the file once between them.
	spare *gzipStream
}

func openArchive(path string) (*archiveSource, error) {
	f, err := os.Open(path) //nolint:gosec // the archive the user names
	if err != nil {
		return nil, fmt.Errorf("snapshot archive: %w", err)
	}
	info, err := f.Stat()
	if err == nil && !info.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file (a push reads the archive twice): %w", path, ErrInvalid)
	}
	if err != nil {
		f.Close() //nolint:errcheck
		return nil, err
	}
	magic := make([]byte, len(gzipMagic))
	n, _ := f.ReadAt(magic, 0)
	return &archiveSource{f: f, gzipped: n == len(magic) && string(magic) == string(gzipMagic)}, nil
}

func (a *archiveSource) Close() error { return a.f.Close() }

// stream reads the tar stream from its start.
func (a *archiveSource) stream() (io.Reader, error) {
	if !a.gzipped {
		return io.NewSectionReader(a.f, 0, math.MaxInt64), nil
	}
	zs, err := a.newGzipStream()
	if err != nil {
		return nil, err
	}
	return zs.zr, nil
}

// entry reads size bytes of the tar stream from offset. Readers may be open at once and opened in
// any order (an upload that is retried reads its file again).
func (a *archiveSource) entry(offset, size int64) (io.ReadCloser, error) {
	if !a.gzipped {
		return io.NopCloser(io.NewSectionReader(a.f, offset, size)), nil
	}
	a.mu.Lock()
	zs := a.spare
	a.spare = nil
	a.mu.Unlock()
	if zs == nil || zs.pos > offset {
		var err error
		if zs, err = a.newGzipStream(); err != nil {
			return nil, err
		}
	}
	skipped, err := io.CopyN(io.Discard, zs.zr, offset-zs.pos)
	zs.pos += skipped
	if err != nil {
		return nil, fmt.Errorf("read the archive at %d, which it no longer reaches: %w", offset, err)
	}
	return &gzipEntry{src: a, zs: zs, left: size}, nil
}

// gzipStream decompresses the archive file; pos is how far into the tar stream it has read.
type gzipStream struct {
	zr  *gzip.Reader
	pos int64
}

func (a *archiveSource) newGzipStream() (*gzipStream, error) {
	zr, err := gzip.NewReader(bufio.NewReaderSize(io.NewSectionReader(a.f, 0, math.MaxInt64), 256<<10))
	if err != nil {
		return nil, fmt.Errorf("gzip: %v: %w", err, ErrInvalid)
	}
	return &gzipStream{zr: zr}, nil
}

// gzipEntry is one entry's bytes read from a gzipStream, which it gives back when closed.
type gzipEntry struct {
	src  *archiveSource
	zs   *gzipStream
	left int64
}

func (e *gzipEntry) Read(p []byte) (int, error) {
	if e.zs == nil {
		return 0, os.ErrClosed
	}
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.zs.zr.Read(p)
	e.zs.pos += int64(n)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) && e.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (e *gzipEntry) Close() error {
	if e.zs != nil {
		e.src.mu.Lock()
		e.src.spare = e.zs
		e.src.mu.Unlock()
		e.zs = nil
	}
	return nil
}

// scannedSnapshot is what the first read of a snapshot, archive or directory, found.
type scannedSnapshot struct {
	export cocoon.SnapshotExport
	// created is snapshot.json's entry time: when cocoon wrote the archive.
	created    time.Time
	checkpoint *checkpoint.Metadata
	files      []scannedFile
	// snapshotJSON is a directory's snapshot.json, as it is.
	snapshotJSON []byte
	// close ends the reads of the files.
	close func() error
}

// scannedFile is one data file of the snapshot: what its header says, and how to read its bytes
// again (open may be called more than once: an upload that is retried reads its file again).
type scannedFile struct {
	name   string
	size   int64
	digest v1.Hash
	record snapshotFile
	open   func() (io.ReadCloser, error)
}

// scanArchive reads the archive through once: a checkpoint's metadata entry if there is one, then
// a snapshot export, snapshot.json first, followed by regular files with plain names.
// Every file is hashed; nothing is kept but its header's record and where its bytes are.
func scanArchive(a *archiveSource) (*scannedSnapshot, error) {
	r, err := a.stream()
	if err != nil {
		return nil, err
	}
	counted := &countingReader{r: r}
	br := bufio.NewReaderSize(counted, peekSize)
	md, err := checkpoint.Read(br)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	if head, _ := br.Peek(len(qcow2Magic)); bytes.Equal(head, qcow2Magic) {
		return nil, fmt.Errorf("a qcow2 disk image, not a cocoon snapshot archive: %w", ErrInvalid)
	}
	scan := &scannedSnapshot{checkpoint: md, close: a.Close}
	// Offsets count from the tar stream's start: what the checkpoint's entry took, then what the
	// tar reader took. archive/tar reads no further than a regular file's header before Next
	// returns, so its count then is where the file's bytes start.
	base := counted.n - int64(br.Buffered())
	tc := &countingReader{r: br}
	tr := tar.NewReader(tc)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && len(seen) == 0 {
			return nil, fmt.Errorf("not a cocoon snapshot archive (a tar, plain or gzip-compressed): %v: %w", err, ErrInvalid)
		}
		if err != nil {
			return nil, fmt.Errorf("read the archive: %v: %w", err, ErrInvalid)
		}
		if len(seen) == 0 {
			if err := scan.readSnapshotJSON(hdr, tr); err != nil {
				return nil, err
			}
			seen[hdr.Name] = true
			continue
		}
		file, err := archiveFileOf(hdr, seen)
		if err != nil {
			return nil, err
		}
		offset, size := base+tc.n, file.size
		file.open = func() (io.ReadCloser, error) { return a.entry(offset, size) }
		h := sha256.New()
		n, err := io.Copy(h, tr)
		if err != nil {
			return nil, fmt.Errorf("read %s in the archive: %v: %w", hdr.Name, err, ErrInvalid)
		}
		if n != file.size {
			return nil, fmt.Errorf("%s in the archive has %d bytes, its header says %d: %w", hdr.Name, n, file.size, ErrInvalid)
		}
		file.digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
		scan.files = append(scan.files, file)
		seen[hdr.Name] = true
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("no %s: not a cocoon snapshot archive: %w", snapshotManifest, ErrInvalid)
	}
	return scan, nil
}

func (s *scannedSnapshot) readSnapshotJSON(hdr *tar.Header, r io.Reader) error {
	if hdr.Name != snapshotManifest {
		return fmt.Errorf("the archive starts with %q, not %s: not a cocoon snapshot archive: %w", hdr.Name, snapshotManifest, ErrInvalid)
	}
	return s.decodeSnapshotJSON(hdr.Typeflag == tar.TypeReg, hdr.Size, hdr.ModTime, r)
}

// decodeSnapshotJSON reads snapshot.json, a regular file (isRegular) of size bytes written at
// modTime: when cocoon exported the snapshot.
func (s *scannedSnapshot) decodeSnapshotJSON(isRegular bool, size int64, modTime time.Time, r io.Reader) error {
	if !isRegular || size > maxSnapshotJSON {
		return fmt.Errorf("%s is not a regular file of at most %d bytes: %w", snapshotManifest, maxSnapshotJSON, ErrInvalid)
	}
	if err := json.NewDecoder(r).Decode(&s.export); err != nil {
		return fmt.Errorf("read %s: %v: %w", snapshotManifest, err, ErrInvalid)
	}
	if s.export.Version != cocoon.SnapshotExportVersion {
		return fmt.Errorf("%s has version %d; cocoon archives have version %d: %w",
			snapshotManifest, s.export.Version, cocoon.SnapshotExportVersion, ErrInvalid)
	}
	s.created = modTime
	if s.created.Unix() <= 0 {
		s.created = time.Now()
	}
	return nil
}

// archiveFileOf checks one entry after snapshot.json: a regular file with a plain name, as cocoon
// exports its snapshot directory, that a pull can make again from a layer. Anything else would be
// dropped or refused by the pull, so the push refuses it.
func archiveFileOf(hdr *tar.Header, seen map[string]bool) (scannedFile, error) {
	switch {
	case seen[hdr.Name]:
		return scannedFile{}, fmt.Errorf("the archive has %s twice: %w", hdr.Name, ErrInvalid)
	case hdr.Typeflag != tar.TypeReg:
		return scannedFile{}, fmt.Errorf("%s in the archive is not a regular file (type %q); a snapshot holds files only: %w", hdr.Name, hdr.Typeflag, ErrInvalid)
	case !plainFileName(hdr.Name):
		return scannedFile{}, fmt.Errorf("%q in the archive is not a plain file name; a snapshot directory is flat: %w", hdr.Name, ErrInvalid)
	}
	file := scannedFile{name: hdr.Name, size: hdr.Size, record: snapshotFile{Mode: hdr.Mode}}
	for key := range hdr.PAXRecords {
		// GNU sparse entries hold a map in their data, which a layer would take for the file's
		// bytes; cocoon writes its own records instead. Records of cocoon's that the artifact
		// format has no field for would be lost.
		if strings.HasPrefix(key, "GNU.sparse.") || (strings.HasPrefix(key, "COCOON.") && key != paxSparseMap && key != paxSparseSize) {
			return scannedFile{}, fmt.Errorf("%s in the archive has the PAX record %s, which a snapshot artifact cannot carry: %w", hdr.Name, key, ErrInvalid)
		}
	}
	sparseMap, hasMap := hdr.PAXRecords[paxSparseMap]
	sparseSize, hasSize := hdr.PAXRecords[paxSparseSize]
	if hasMap != hasSize {
		return scannedFile{}, fmt.Errorf("%s in the archive has only one of %s and %s: %w", hdr.Name, paxSparseMap, paxSparseSize, ErrInvalid)
	}
	if hasMap {
		size, err := strconv.ParseInt(sparseSize, 10, 64)
		if err != nil || size <= 0 || sparseMap == "" {
			return scannedFile{}, fmt.Errorf("%s in the archive has the sparse records %s=%q, %s=%q: %w",
				hdr.Name, paxSparseMap, sparseMap, paxSparseSize, sparseSize, ErrInvalid)
		}
		file.record.SparseMap, file.record.SparseSize = sparseMap, size
	}
	return file, nil
}

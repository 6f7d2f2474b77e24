package cocoonsim

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/sparse"
)

// PAX keys of cocoon's sparse tar entries (utils/tar.go): the entry carries only the data
// segments; the map and the real size are in these records.
const (
	paxSparseMap  = "COCOON.sparse.map"
	paxSparseSize = "COCOON.sparse.size"
	zeroBlockSize = 4096
)

// reflinkCopy clones src to dst (FICLONE) where the filesystem can, and otherwise copies only
// its data segments, keeping holes.
func reflinkCopy(dst, src string) error {
	in, err := os.Open(src) //nolint:gosec // cocoon-managed path
	if err != nil {
		return fmt.Errorf("open src: %w", err)
	}
	defer in.Close() //nolint:errcheck
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("stat src: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm()) //nolint:gosec // cocoon-managed path
	if err != nil {
		return fmt.Errorf("create dst: %w", err)
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	copyErr := copySegments(out, in, fi.Size())
	closeErr := out.Close()
	if copyErr != nil {
		_ = os.Remove(dst)
		return copyErr
	}
	return closeErr
}

func copySegments(out, in *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("truncate dst: %w", err)
	}
	segments, err := sparse.DataSegments(in, size)
	if err != nil {
		return err
	}
	for _, seg := range segments {
		if _, err := io.Copy(io.NewOffsetWriter(out, seg.Offset), io.NewSectionReader(in, seg.Offset, seg.Length)); err != nil {
			return fmt.Errorf("copy segment at %d len %d: %w", seg.Offset, seg.Length, err)
		}
	}
	return out.Sync()
}

// copyFile copies a small file byte for byte.
func copyFile(dst, src string) error {
	in, err := os.Open(src) //nolint:gosec // cocoon-managed path
	if err != nil {
		return err
	}
	defer in.Close() //nolint:errcheck
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm()) //nolint:gosec // cocoon-managed path
	if err != nil {
		return err
	}
	_, copyErr := io.Copy(out, in)
	return errors.Join(copyErr, out.Close())
}

// tarDir writes the regular files of dir as flat entries, sparse files in cocoon's PAX form.
func tarDir(tw *tar.Writer, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read dir %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := tarFile(tw, filepath.Join(dir, e.Name()), e.Name()); err != nil {
			return err
		}
	}
	return nil
}

func tarFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path) //nolint:gosec // snapshot data dir
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return fmt.Errorf("tar header for %s: %w", path, err)
	}
	hdr.Name = name
	segments := []sparse.Segment{{Offset: 0, Length: fi.Size()}}
	if fi.Size() > 0 {
		if scanned, scanErr := sparse.DataSegments(f, fi.Size()); scanErr == nil && sparse.Bytes(scanned) < fi.Size() {
			mapJSON, err := json.Marshal(scanned)
			if err != nil {
				return fmt.Errorf("marshal sparse map for %s: %w", path, err)
			}
			segments = scanned
			hdr.Size = sparse.Bytes(scanned)
			hdr.PAXRecords = map[string]string{paxSparseMap: string(mapJSON), paxSparseSize: strconv.FormatInt(fi.Size(), 10)}
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write header %s: %w", name, err)
	}
	if _, err := io.Copy(tw, sparse.Reader(f, segments)); err != nil {
		return fmt.Errorf("write data %s: %w", name, err)
	}
	return nil
}

// extractTar writes the regular-file entries of a flat archive into dir (directory parts of
// entry names are dropped), restoring cocoon's sparse entries and skipping zero blocks of plain
// ones, as cocoon's ExtractTar.
func extractTar(dir string, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tar next: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		name := filepath.Base(hdr.Name)
		if name == "." || name == ".." || name == "/" {
			continue
		}
		path := filepath.Join(dir, name)
		if mapJSON, ok := hdr.PAXRecords[paxSparseMap]; ok {
			if err := extractSparse(path, tr, hdr, mapJSON); err != nil {
				return fmt.Errorf("extract sparse %s: %w", name, err)
			}
			continue
		}
		if err := extractPlain(path, tr, hdr.FileInfo().Mode()); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
}

func extractSparse(path string, r io.Reader, hdr *tar.Header, mapJSON string) error {
	realSize, err := strconv.ParseInt(hdr.PAXRecords[paxSparseSize], 10, 64)
	if err != nil {
		return fmt.Errorf("parse sparse size: %w", err)
	}
	var segments []sparse.Segment
	if err := json.Unmarshal([]byte(mapJSON), &segments); err != nil {
		return fmt.Errorf("decode sparse map: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, hdr.FileInfo().Mode()) //nolint:gosec // extraction dir
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck
	if err := f.Truncate(realSize); err != nil {
		return err
	}
	for _, seg := range segments {
		if _, err := io.CopyN(io.NewOffsetWriter(f, seg.Offset), r, seg.Length); err != nil {
			return err
		}
	}
	return f.Sync()
}

func extractPlain(path string, r io.Reader, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm) //nolint:gosec // extraction dir
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck
	buf := make([]byte, zeroBlockSize)
	var total int64
	for {
		n, readErr := io.ReadFull(r, buf)
		if n > 0 {
			if isZero(buf[:n]) {
				_, err = f.Seek(int64(n), io.SeekCurrent)
			} else {
				_, err = f.Write(buf[:n])
			}
			if err != nil {
				return err
			}
			total += int64(n)
		}
		if readErr == io.EOF || readErr == io.ErrUnexpectedEOF {
			break
		}
		if readErr != nil {
			return readErr
		}
	}
	// A trailing hole does not extend the file by itself.
	if err := f.Truncate(total); err != nil {
		return err
	}
	return f.Sync()
}

func isZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

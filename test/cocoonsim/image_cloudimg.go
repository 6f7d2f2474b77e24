package cocoonsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// cloudimgEntry is one image in <root>/cloudimg/db/images.json.
type cloudimgEntry struct {
	Ref        string    `json:"ref"`
	ContentSum string    `json:"content_sum"`
	Size       int64     `json:"size"`
	CreatedAt  time.Time `json:"created_at"`
}

func (e *cloudimgEntry) id() string         { return e.ContentSum }
func (e *cloudimgEntry) ref() string        { return e.Ref }
func (e *cloudimgEntry) created() time.Time { return e.CreatedAt }
func (e *cloudimgEntry) size() int64        { return e.Size }

type cloudimgIndex struct {
	Images map[string]*cloudimgEntry `json:"images"`
}

func (idx *cloudimgIndex) initMaps() {
	if idx.Images == nil {
		idx.Images = map[string]*cloudimgEntry{}
	}
}

// cloudimgStore is the cloud image (qcow2, UEFI boot) backend.
type cloudimgStore struct {
	imageOps[cloudimgIndex, *cloudimgEntry]
	dirs     imageDirs
	firmware string
}

func newCloudimgStore(rootDir string) (*cloudimgStore, error) {
	dirs := imageDirs{base: filepath.Join(rootDir, "cloudimg"), blobExt: ".qcow2"}
	if err := dirs.ensure(); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	return &cloudimgStore{
		imageOps: imageOps[cloudimgIndex, *cloudimgEntry]{
			backendType: cocoon.ImageTypeCloudImg,
			db:          indexDB[cloudimgIndex](dirs),
			entries:     func(idx *cloudimgIndex) map[string]*cloudimgEntry { return idx.Images },
		},
		dirs:     dirs,
		firmware: filepath.Join(rootDir, "firmware", "CLOUDHV.fd"),
	}, nil
}

// config resolves a cloud image to its base qcow2 and the UEFI firmware.
func (s *cloudimgStore) config(ctx context.Context, spec *vmSpec) (storage []*cocoon.StorageConfig, boot *bootConfig, err error) {
	err = s.db.With(ctx, func(idx *cloudimgIndex) error {
		e := idx.Images[spec.Image]
		for _, candidate := range idx.Images {
			if e == nil && (candidate.ContentSum == spec.Image || digestHex(candidate.ContentSum) == spec.Image) {
				e = candidate
			}
		}
		if e == nil {
			return fmt.Errorf("image %q not found for VM %s", spec.Image, spec.Name)
		}
		spec.ImageDigest, spec.ImageType = e.ContentSum, cocoon.ImageTypeCloudImg
		blob := s.dirs.blobPath(digestHex(e.ContentSum))
		if !validFile(blob) {
			return fmt.Errorf("blob invalid for VM %s (%s)", spec.Name, e.ContentSum)
		}
		storage = []*cocoon.StorageConfig{{Path: blob, RO: true, Serial: "cocoon-base", Role: cocoon.StorageRoleLayer}}
		if !validFile(s.firmware) {
			return fmt.Errorf("firmware not found: %s", s.firmware)
		}
		boot = &bootConfig{FirmwarePath: s.firmware}
		return nil
	})
	return storage, boot, err
}

// importFiles imports one qcow2 file, or several split parts concatenated in order.
func (s *cloudimgStore) importFiles(ctx context.Context, name string, files []string) error {
	if len(files) == 1 {
		return s.importFile(ctx, name, files[0])
	}
	head, err := concatHead(files)
	if err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	if err := sniffHead(head); err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	readers := make([]io.Reader, 0, len(files))
	for _, path := range files {
		f, err := os.Open(path) //nolint:gosec // operator-supplied import file
		if err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		defer f.Close() //nolint:errcheck
		readers = append(readers, f)
	}
	return s.importStream(ctx, name, io.MultiReader(readers...))
}

func (s *cloudimgStore) importFile(ctx context.Context, name, path string) error {
	f, err := os.Open(path) //nolint:gosec // operator-supplied import file
	if err != nil {
		return fmt.Errorf("import %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck
	head := make([]byte, 8)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("import %s: read source: %w", path, err)
	}
	if err := sniffHead(head[:n]); err != nil {
		return fmt.Errorf("import %s: %w", path, err)
	}
	return s.importStream(ctx, name, f)
}

// importReader imports a qcow2 stream (stdin, possibly un-gzipped already).
func (s *cloudimgStore) importReader(ctx context.Context, name string, r io.Reader) error {
	head := make([]byte, 8)
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("import %s: read stream: %w", name, err)
	}
	if err := sniffHead(head[:n]); err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	return s.importStream(ctx, name, io.MultiReader(bytes.NewReader(head[:n]), r))
}

// importStream buffers the image into the temp dir while hashing it, then commits it.
func (s *cloudimgStore) importStream(ctx context.Context, name string, r io.Reader) error {
	tmp, err := os.CreateTemp(s.dirs.tempDir(), "import-*.img")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck
	defer tmp.Close()           //nolint:errcheck
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), r); err != nil {
		return fmt.Errorf("copy to temp: %w", err)
	}
	return s.commit(ctx, name, tmp.Name(), hex.EncodeToString(h.Sum(nil)))
}

// commit stores the blob (as-is when it already is a qcow2 v3 without backing file, converted by
// qemu-img otherwise) and records name -> digest.
func (s *cloudimgStore) commit(ctx context.Context, name, source, digest string) error {
	blob := s.dirs.blobPath(digest)
	var staged string
	if !validFile(blob) {
		var err error
		if staged, err = s.stageBlob(ctx, source, digest); err != nil {
			return err
		}
		defer os.Remove(staged) //nolint:errcheck
	}
	return s.db.Update(ctx, func(idx *cloudimgIndex) error {
		if staged != "" && !validFile(blob) {
			if err := os.Rename(staged, blob); err != nil {
				return fmt.Errorf("update index: rename blob: %w", err)
			}
			_ = os.Chmod(blob, 0o444) //nolint:gosec // blobs are world-readable in cocoon
		}
		fi, err := os.Stat(blob)
		if err != nil {
			return fmt.Errorf("update index: stat blob %s: %w", blob, err)
		}
		idx.Images[name] = &cloudimgEntry{Ref: name, ContentSum: "sha256:" + digest, Size: fi.Size(), CreatedAt: time.Now()}
		return nil
	})
}

func (s *cloudimgStore) stageBlob(ctx context.Context, source, digest string) (string, error) {
	staged := filepath.Join(s.dirs.tempDir(), ".tmp-"+digest+".qcow2")
	version, hasBacking, err := qcow2Header(source)
	if err != nil {
		return "", fmt.Errorf("inspect image: %w", err)
	}
	if version == 3 && !hasBacking {
		if err := os.Rename(source, staged); err != nil {
			return "", fmt.Errorf("rename tmp blob: %w", err)
		}
		return staged, nil
	}
	unlock, err := flockWait(ctx, staged+".lock")
	if err != nil {
		return "", fmt.Errorf("acquire convert lock: %w", err)
	}
	defer unlock()
	out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", "-o", "compat=1.1", source, staged).CombinedOutput()
	if err != nil {
		_ = os.Remove(staged)
		return "", fmt.Errorf("qemu-img convert: %s: %w", strings.TrimSpace(string(out)), err)
	}
	return staged, nil
}

// qcow2Header reads the version and whether a backing file is set.
func qcow2Header(path string) (version uint32, hasBacking bool, err error) {
	f, err := os.Open(path) //nolint:gosec // temp file
	if err != nil {
		return 0, false, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck
	var hdr [16]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil || !bytes.Equal(hdr[:4], qcow2Magic) {
		return 0, false, fmt.Errorf("%s is not a qcow2 image", path)
	}
	version = binary.BigEndian.Uint32(hdr[4:8])
	if version != 2 && version != 3 {
		return 0, false, fmt.Errorf("unsupported qcow2 version %d", version)
	}
	return version, binary.BigEndian.Uint64(hdr[8:16]) != 0, nil
}

// sniffHead rejects content cocoon knows is not a disk image.
func sniffHead(head []byte) error {
	if len(head) < 4 {
		return fmt.Errorf("content too small to be a disk image (%d bytes)", len(head))
	}
	if bytes.HasPrefix(head, qcow2Magic) {
		return nil
	}
	for _, sig := range []struct {
		prefix []byte
		desc   string
	}{
		{[]byte("<!"), "content looks like HTML/XML, not a disk image"},
		{[]byte("<?"), "content looks like HTML/XML, not a disk image"},
		{[]byte("<h"), "content looks like HTML, not a disk image"},
		{[]byte("<H"), "content looks like HTML, not a disk image"},
		{[]byte{0x1f, 0x8b}, "content is gzip-compressed (cloudimg does not auto-decompress)"},
		{[]byte("\xfd7zXZ\x00"), "content is xz-compressed (cloudimg does not auto-decompress)"},
		{[]byte("BZh"), "content is bzip2-compressed (cloudimg does not auto-decompress)"},
		{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "content is zstd-compressed (cloudimg does not auto-decompress)"},
		{[]byte("PK"), "content is a zip archive, not a disk image"},
		{[]byte{0x37, 0x7a, 0xbc, 0xaf, 0x27, 0x1c}, "content is a 7z archive, not a disk image"},
	} {
		if bytes.HasPrefix(head, sig.prefix) {
			return errors.New(sig.desc)
		}
	}
	return nil
}

// concatHead reads the first 8 bytes across split parts.
func concatHead(files []string) ([]byte, error) {
	head := make([]byte, 0, 8)
	for _, path := range files {
		if len(head) == 8 {
			break
		}
		f, err := os.Open(path) //nolint:gosec // operator-supplied import file
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		buf := make([]byte, 8-len(head))
		n, readErr := f.ReadAt(buf, 0)
		_ = f.Close()
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			return nil, fmt.Errorf("peek %s: %w", path, readErr)
		}
		head = append(head, buf[:n]...)
	}
	return head, nil
}

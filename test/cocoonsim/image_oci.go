package cocoonsim

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
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

// ociEntry is one image in <root>/oci/db/images.json (cocoon's images/oci imageEntry).
type ociEntry struct {
	Ref            string     `json:"ref"`
	ManifestDigest string     `json:"manifest_digest"`
	Layers         []ociLayer `json:"layers"`
	KernelLayer    string     `json:"kernel_layer"`
	InitrdLayer    string     `json:"initrd_layer"`
	Size           int64      `json:"size"`
	CreatedAt      time.Time  `json:"created_at"`
}

type ociLayer struct {
	Digest string `json:"digest"`
}

func (e *ociEntry) id() string         { return e.ManifestDigest }
func (e *ociEntry) ref() string        { return e.Ref }
func (e *ociEntry) created() time.Time { return e.CreatedAt }
func (e *ociEntry) size() int64        { return e.Size }

type ociIndex struct {
	Images map[string]*ociEntry `json:"images"`
}

func (idx *ociIndex) initMaps() {
	if idx.Images == nil {
		idx.Images = map[string]*ociEntry{}
	}
}

// ociStore is the OCI image backend. cocoon converts each layer tar to EROFS with mkfs.erofs; the
// simulator requires mkfs.erofs the same way but keeps the layer tar itself as the blob, which is
// where the simulated guest finds its behaviour file.
type ociStore struct {
	imageOps[ociIndex, *ociEntry]
	dirs imageDirs
}

func newOCIStore(rootDir string) (*ociStore, error) {
	dirs := imageDirs{base: filepath.Join(rootDir, "oci"), blobExt: ".erofs"}
	if err := dirs.ensure(); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	s := &ociStore{dirs: dirs}
	if err := ensureDirs(s.bootBaseDir()); err != nil {
		return nil, fmt.Errorf("ensure dirs: %w", err)
	}
	s.imageOps = imageOps[ociIndex, *ociEntry]{
		backendType: cocoon.ImageTypeOCI,
		db:          indexDB[ociIndex](dirs),
		entries:     func(idx *ociIndex) map[string]*ociEntry { return idx.Images },
	}
	return s, nil
}

func (s *ociStore) bootBaseDir() string { return filepath.Join(s.dirs.base, "boot") }
func (s *ociStore) kernelPath(layer string) string {
	return filepath.Join(s.bootBaseDir(), layer, "vmlinuz")
}
func (s *ociStore) initrdPath(layer string) string {
	return filepath.Join(s.bootBaseDir(), layer, "initrd.img")
}

// lookup finds an image for VM creation: by its literal name or its manifest digest.
func (idx *ociIndex) lookup(ref string) (*ociEntry, bool) {
	if e := idx.Images[ref]; e != nil {
		return e, true
	}
	for _, e := range idx.Images {
		if e.ManifestDigest == ref {
			return e, true
		}
	}
	return nil, false
}

// config resolves an OCI image to its read-only layer disks and direct-boot kernel and initrd.
func (s *ociStore) config(ctx context.Context, spec *vmSpec) (storage []*cocoon.StorageConfig, boot *bootConfig, err error) {
	err = s.db.With(ctx, func(idx *ociIndex) error {
		e, ok := idx.lookup(spec.Image)
		if !ok {
			return fmt.Errorf("image %q not found for VM %s", spec.Image, spec.Name)
		}
		spec.ImageDigest, spec.ImageType = e.ManifestDigest, cocoon.ImageTypeOCI
		for j, layer := range e.Layers {
			blob := s.dirs.blobPath(digestHex(layer.Digest))
			if !validFile(blob) {
				return fmt.Errorf("blob invalid for VM %s layer %d (%s)", spec.Name, j, layer.Digest)
			}
			storage = append(storage, &cocoon.StorageConfig{Path: blob, RO: true, Serial: fmt.Sprintf("cocoon-layer%d", j), Role: cocoon.StorageRoleLayer})
		}
		kernel, initrd := s.kernelPath(digestHex(e.KernelLayer)), s.initrdPath(digestHex(e.InitrdLayer))
		if !validFile(kernel) {
			return fmt.Errorf("kernel invalid for VM %s (%s)", spec.Name, e.KernelLayer)
		}
		if !validFile(initrd) {
			return fmt.Errorf("initrd invalid for VM %s (%s)", spec.Name, e.InitrdLayer)
		}
		boot = &bootConfig{KernelPath: kernel, InitrdPath: initrd}
		return nil
	})
	return storage, boot, err
}

// layerResult is one processed layer, staged in the import's work directory.
type layerResult struct {
	hex    string
	tar    string
	kernel string
	initrd string
}

// importLayers stores the given layer tars as one image named name, holding the index lock for
// the whole import as cocoon does. Layer processing errors are wrapped with stage ("process
// layers" for files, "process layer" for a stream, as cocoon words them). With convert set, each
// layer also goes through mkfs.erofs, which therefore must be installed; SeedOCIImage passes false.
func (s *ociStore) importLayers(ctx context.Context, name, stage string, layers []io.Reader, convert bool) (string, error) {
	var manifest string
	err := s.db.Update(ctx, func(idx *ociIndex) error {
		workDir, err := os.MkdirTemp(s.dirs.tempDir(), "import-*")
		if err != nil {
			return fmt.Errorf("create work dir: %w", err)
		}
		defer os.RemoveAll(workDir) //nolint:errcheck
		results := make([]layerResult, len(layers))
		for i, r := range layers {
			if results[i], err = s.processLayer(ctx, r, workDir, i, convert); err != nil {
				return fmt.Errorf("%s: %w", stage, err)
			}
		}
		manifest = manifestDigest(results)
		return s.commit(idx, name, manifest, results)
	})
	return manifest, err
}

// processLayer hashes one layer tar into the work directory (feeding mkfs.erofs on the way when
// converting) and extracts its boot files.
func (s *ociStore) processLayer(ctx context.Context, r io.Reader, workDir string, i int, convert bool) (layerResult, error) {
	res := layerResult{tar: filepath.Join(workDir, fmt.Sprintf("layer-%d.tar", i))}
	out, err := os.Create(res.tar) //nolint:gosec // work dir
	if err != nil {
		return res, fmt.Errorf("create layer file: %w", err)
	}
	defer out.Close() //nolint:errcheck
	hasher := sha256.New()
	sinks := []io.Writer{out, hasher}

	var erofs *exec.Cmd
	var erofsIn io.WriteCloser
	var erofsOut bytes.Buffer
	if convert {
		erofs = exec.CommandContext(ctx, "mkfs.erofs", "--tar=f", "-zlz4hc", "-C4096", "-T0", "-U", randomUUID(),
			filepath.Join(workDir, fmt.Sprintf("layer-%d.erofs", i)))
		erofs.Stdout, erofs.Stderr = &erofsOut, &erofsOut
		if erofsIn, err = erofs.StdinPipe(); err != nil {
			return res, fmt.Errorf("start erofs conversion: create stdin pipe: %w", err)
		}
		if err := erofs.Start(); err != nil {
			return res, fmt.Errorf("start erofs conversion: start mkfs.erofs: %w", err)
		}
		sinks = append(sinks, erofsIn)
	}
	_, copyErr := io.Copy(io.MultiWriter(sinks...), r)
	if convert {
		_ = erofsIn.Close()
		if err := erofs.Wait(); err != nil {
			return res, fmt.Errorf("mkfs.erofs failed: %w (output: %s)", err, erofsOut.String())
		}
	}
	if copyErr != nil {
		return res, fmt.Errorf("scan boot files: read tar entry: %w", copyErr)
	}
	res.hex = hex.EncodeToString(hasher.Sum(nil))
	if res.kernel, res.initrd, err = extractBootFiles(res.tar, workDir, i); err != nil {
		return res, fmt.Errorf("scan boot files: %w", err)
	}
	return res, nil
}

// extractBootFiles copies vmlinuz* and initrd.img* found at the root or under boot/ of a layer.
func extractBootFiles(tarPath, workDir string, i int) (kernel, initrd string, err error) {
	f, err := os.Open(tarPath) //nolint:gosec // work dir
	if err != nil {
		return "", "", err
	}
	defer f.Close() //nolint:errcheck
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kernel, initrd, nil
		}
		if err != nil {
			return "", "", fmt.Errorf("read tar entry: %w", err)
		}
		name := filepath.Clean(hdr.Name)
		base := filepath.Base(name)
		dir := filepath.Dir(name)
		isKernel, isInitrd := strings.HasPrefix(base, "vmlinuz"), strings.HasPrefix(base, "initrd.img")
		if hdr.Typeflag != tar.TypeReg || strings.HasSuffix(base, ".old") || (!isKernel && !isInitrd) || (dir != "boot" && dir != ".") {
			continue
		}
		dst := filepath.Join(workDir, fmt.Sprintf("layer-%d.%s", i, map[bool]string{true: "vmlinuz", false: "initrd.img"}[isKernel]))
		if err := writeFileFrom(dst, tr); err != nil {
			return "", "", err
		}
		if isKernel {
			kernel = dst
		} else {
			initrd = dst
		}
	}
}

func writeFileFrom(path string, r io.Reader) error {
	f, err := os.Create(path) //nolint:gosec // work dir
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	_, copyErr := io.Copy(f, r)
	return errors.Join(copyErr, f.Close())
}

// commit moves staged layers and boot files into place and records the image.
func (s *ociStore) commit(idx *ociIndex, name, manifest string, results []layerResult) error {
	entry := &ociEntry{Ref: name, ManifestDigest: manifest, CreatedAt: time.Now()}
	for i, r := range results {
		blob := s.dirs.blobPath(r.hex)
		if !validFile(blob) {
			if err := os.Rename(r.tar, blob); err != nil {
				return fmt.Errorf("move layer %d erofs: %w", i, err)
			}
		}
		digest := "sha256:" + r.hex
		for _, boot := range []struct{ src, dst, kind string }{
			{r.kernel, s.kernelPath(r.hex), "kernel"}, {r.initrd, s.initrdPath(r.hex), "initrd"},
		} {
			if boot.src == "" {
				continue
			}
			if err := ensureDirs(filepath.Dir(boot.dst)); err != nil {
				return fmt.Errorf("create boot dir for layer %d: %w", i, err)
			}
			if err := os.Rename(boot.src, boot.dst); err != nil {
				return fmt.Errorf("move layer %d %s: %w", i, boot.kind, err)
			}
			if boot.kind == "kernel" {
				entry.KernelLayer = digest
			} else {
				entry.InitrdLayer = digest
			}
		}
		entry.Layers = append(entry.Layers, ociLayer{Digest: digest})
	}
	if entry.KernelLayer == "" || entry.InitrdLayer == "" {
		return fmt.Errorf("image %s missing boot files (vmlinuz/initrd.img)", name)
	}
	for _, layer := range entry.Layers {
		entry.Size += fileSize(s.dirs.blobPath(digestHex(layer.Digest)))
	}
	entry.Size += fileSize(s.kernelPath(digestHex(entry.KernelLayer))) + fileSize(s.initrdPath(digestHex(entry.InitrdLayer)))
	idx.Images[name] = entry
	return nil
}

func fileSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// manifestDigest is cocoon's digest of an imported image: sha256 over the layer hex digests.
func manifestDigest(results []layerResult) string {
	h := sha256.New()
	for _, r := range results {
		h.Write([]byte(r.hex))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

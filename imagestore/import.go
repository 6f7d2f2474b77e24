package imagestore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// localNamePrefix starts every cocoon artifact cocoon-cri owns.
const localNamePrefix = "cri-sha256-"

// LocalName is the cocoon artifact name of an image ID: derived from the digest, so references to
// one digest share one artifact.
func LocalName(id string) string {
	return localNamePrefix + strings.TrimPrefix(id, "sha256:")
}

// FileDigest is the sha256 digest of a file's content, as Import expects it.
func FileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// Import brings an artifact from r into cocoon and records it under ref: a cocoon snapshot archive
// (containers clone it) or a qcow2 cloud image (containers boot it), gzip-wrapped or not. digest
// is the sha256 of the bytes of r; a stream that does not match it is rejected and leaves nothing.
// Importing a digest already present only adds the reference.
func (s *Service) Import(ctx context.Context, ref, digest string, r io.Reader) (*store.Image, error) {
	tag, err := NormalizeTag(ref)
	if err != nil {
		return nil, err
	}
	id, ok := asID(digest)
	if !ok {
		return nil, fmt.Errorf("digest %q is not a sha256 digest: %w", digest, ErrInvalid)
	}
	img, err := s.importLocked(ctx, id, tag, r)
	if err != nil {
		return nil, err
	}
	// The tag may have left another image with no reference: delete it unless still needed.
	if err := s.Sweep(ctx); err != nil {
		s.log.Warn("deleting unused artifacts failed; the next removal retries", "err", err)
	}
	return img, nil
}

func (s *Service) importLocked(ctx context.Context, id, tag string, r io.Reader) (*store.Image, error) {
	unlock := s.digestLocks.Lock(id)
	defer unlock()
	// cocoon already holds the artifact of a known digest (maybe of a removed image): tag it.
	if img, err := s.store.Images.Get(id); err == nil {
		return s.commit(img, tag)
	}
	// The digest covers the whole stream, a checkpoint's metadata entry included.
	hash := sha256.New()
	br := bufio.NewReaderSize(io.TeeReader(r, hash), peekSize)
	// cocoon gets a checkpoint archive without its metadata entry: exactly the snapshot export.
	if _, err := checkpoint.Read(br); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	kind, err := detectKind(br)
	if err != nil {
		return nil, err
	}
	img, err := s.importArtifact(ctx, id, kind, br, func() error {
		if got := "sha256:" + hex.EncodeToString(hash.Sum(nil)); got != id {
			return fmt.Errorf("content digest is %s, not the expected %s: %w", got, id, ErrInvalid)
		}
		return nil
	})
	if err == nil {
		// An archive comes from no registry: its base only with cocoon's own credentials.
		err = s.withBase(ctx, img, name.Registry{}, Credentials{})
	}
	if err != nil {
		return nil, err
	}
	return s.commit(img, tag)
}

// withBase is ensureBase for an artifact just brought in, which goes again when its base cannot
// be had.
func (s *Service) withBase(ctx context.Context, img *store.Image, registry name.Registry, creds Credentials) error {
	err := s.ensureBase(ctx, img, registry, creds)
	if err != nil {
		s.discardArtifact(ctx, img.Kind, img.LocalName)
	}
	return err
}

// importArtifact streams the artifact into cocoon under the digest's local name. verify, when
// set, runs once cocoon has read the whole stream and may still reject it. On any failure the
// artifact is deleted again.
func (s *Service) importArtifact(ctx context.Context, id string, kind store.ImageKind, r io.Reader, verify func() error) (*store.Image, error) {
	name := LocalName(id)
	// A leftover of an import that a crash cut short holds the name: no record points at it.
	if err := s.deleteArtifact(ctx, kind, name); err != nil {
		return nil, err
	}
	counted := &countingReader{r: r}
	img := &store.Image{ID: id, Kind: kind, LocalName: name, CreatedAt: time.Now().UnixNano()}
	start := time.Now()
	err := s.runImport(ctx, img, counted)
	if err == nil {
		// cocoon may stop reading at the tar end-of-archive blocks; the padding after them is part
		// of the digest.
		_, err = io.Copy(io.Discard, counted)
	}
	if err == nil && verify != nil {
		err = verify()
	}
	if err != nil {
		s.discardArtifact(ctx, kind, name)
		return nil, fmt.Errorf("import %s: %w", id, err)
	}
	img.Size = counted.n
	s.log.Info("image imported", "image", id, "kind", kind, "artifact", name, "bytes", counted.n, "took", time.Since(start))
	return img, nil
}

// discardArtifact deletes the artifact of a failed import or pull. The caller's context may be
// what failed, so the deletion gets its own.
func (s *Service) discardArtifact(ctx context.Context, kind store.ImageKind, name string) {
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cocoon.DefaultTimeout)
	defer cancel()
	if err := s.deleteArtifact(cleanupCtx, kind, name); err != nil {
		s.log.Error("could not delete the artifact of a failed import or pull", "artifact", name, "err", err)
	}
}

func (s *Service) runImport(ctx context.Context, img *store.Image, r io.Reader) error {
	if img.Kind == store.ImageSnapshot {
		snap, err := s.cocoon.SnapshotImport(ctx, r, img.LocalName, "")
		if err != nil {
			return err
		}
		img.Snapshot = snapshotInfo(snap.SnapshotConfig)
		return nil
	}
	_, err := s.cocoon.ImageImport(ctx, r, img.LocalName)
	return err
}

// commit records img under refs (tags and digest references) in one transaction: a reference
// leaves any image that held it (which is removed if that was its last reference), and a removed
// image becomes visible again. The caller holds the digest lock of img.
func (s *Service) commit(img *store.Image, refs ...string) (*store.Image, error) {
	var out *store.Image
	err := s.store.Images.Update(func(tx *store.Tx[store.Image]) error {
		for _, ref := range refs {
			holder, ok := tx.Holder(ref)
			if !ok || holder == img.ID {
				continue
			}
			old, _ := tx.Get(holder)
			dropReference(old, ref)
			old.Removed = len(old.RepoTags)+len(old.RepoDigests) == 0
			if err := tx.Put(old); err != nil {
				return err
			}
		}
		rec, ok := tx.Get(img.ID)
		switch {
		case !ok:
			rec = img
		case img.FromDir && rec.FromDir:
			// The same snapshot directory found at another path: the latest is the one to clone.
			rec.LocalName = img.LocalName
		}
		rec.Removed = false
		for _, ref := range refs {
			addReference(rec, ref)
		}
		out = rec
		return tx.Put(rec)
	})
	if err != nil {
		return nil, fmt.Errorf("record image %s: %w", img.ID, err)
	}
	return out, nil
}

// addReference adds a normalized reference to the image's tags or, naming a digest, to its
// repository digests.
func addReference(img *store.Image, ref string) {
	list := &img.RepoTags
	if isDigested(ref) {
		list = &img.RepoDigests
	}
	if !slices.Contains(*list, ref) {
		*list = append(*list, ref)
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

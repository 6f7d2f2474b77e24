// Package imagestore keeps the CRI's images: records in pkg/store, artifacts in cocoon (snapshots
// for clones, cloud and OCI images for boots). An image's ID is its content digest, its cocoon
// artifact is named after that digest, so two references to one digest share one artifact.
package imagestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/refresh"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

var (
	// ErrNotFound: no image has that reference or ID.
	ErrNotFound = errdefs.ErrNotFound.WithMessage("image not found")
	// ErrInvalid: the reference or the content is not acceptable.
	ErrInvalid = errdefs.ErrInvalidArgument.WithMessage("invalid image")
)

// Dirs are cocoon's directories, where image and container bytes live.
type Dirs struct {
	Root string // cocoon --root-dir: snapshots and images
	Run  string // cocoon --run-dir: the VMs' writable disks
}

// PullOptions configure pulls from registries.
type PullOptions struct {
	// Insecure lists registries (host or host:port) that may be reached over plain HTTP; loopback
	// ones always may.
	Insecure []string
	// CAFile is a PEM bundle trusted for registry TLS besides the system roots.
	CAFile string
	// ProgressTimeout fails a pull that receives nothing for this long; 0 never does.
	ProgressTimeout time.Duration
	// OnProgress, when set, is told how pulls advance (every few seconds, and once at the end of a
	// pull that succeeded), from the pulls' goroutines.
	OnProgress func(PullProgress)
	// OnPulled, when set, is told about every pull that ended, from the pull's goroutine: once per
	// download, however many requests shared it.
	OnPulled func(PullResult)
	// CredentialsDir holds, for the length of a pull, the registry credentials cocoon reads when it
	// pulls an OCI VM image itself. Required: a private directory under cocoon-cri's state (made
	// 0700, emptied at start), never a shared temporary directory.
	CredentialsDir string
}

// PullResult is how a pull ended, as the OnPulled hook is told it.
type PullResult struct {
	Ref string
	// Kind is the artifact's kind; empty when the pull failed before the manifest was classified.
	Kind store.ImageKind
	// Present: the digest was on the node already, so the pull only tagged it.
	Present bool
	// Bytes were downloaded from the registry (not those cocoon downloads itself for an OCI image).
	Bytes int64
	Took  time.Duration
	Err   error
}

// Cocoon is what the image service runs of cocoon: *cocoon.Client's methods of the same names, with
// their contract (docs/cocoon-contract.md). A missing artifact's removal is cocoon.ErrNotFound.
type Cocoon interface {
	SnapshotImport(ctx context.Context, r io.Reader, name, description string) (*cocoon.Snapshot, error)
	SnapshotRemove(ctx context.Context, ref string) error
	ImageImport(ctx context.Context, r io.Reader, name string) (*cocoon.Image, error)
	ImagePull(ctx context.Context, ref string, o cocoon.PullOptions) (*cocoon.Image, error)
	ImageInspect(ctx context.Context, ref string) (*cocoon.Image, error)
	ImageRemove(ctx context.Context, ref string) error
}

var _ Cocoon = (*cocoon.Client)(nil)

// Service manages images.
type Service struct {
	store    *store.Store
	cocoon   Cocoon
	log      *slog.Logger
	dirs     Dirs
	fs       *refresh.Value[fsUsage]
	registry *registryClient
	pullOpts PullOptions
	pulls    pullFlights

	// digestLocks serialise the work on one artifact (import, pull, deletion); record changes are
	// transactions of the store.
	digestLocks keylock.Map
}

// New returns the image service over cc (the daemon's *cocoon.Client, or a test's fake).
func New(st *store.Store, cc Cocoon, log *slog.Logger, dirs Dirs, pull PullOptions) (*Service, error) {
	registry, err := newRegistryClient(pull.Insecure, pull.CAFile)
	if err != nil {
		return nil, err
	}
	if err := resetCredentialsDir(pull.CredentialsDir); err != nil {
		return nil, err
	}
	s := &Service{store: st, cocoon: cc, log: log, dirs: dirs, registry: registry, pullOpts: pull}
	s.fs = refresh.New(fsUsageInterval, fsUsageTimeout, s.measure)
	return s, nil
}

// Get returns the visible image a reference, an ID or an ID prefix names.
func (s *Service) Get(refOrID string) (*store.Image, error) {
	if refOrID == "" {
		return nil, fmt.Errorf("empty image reference: %w", ErrInvalid)
	}
	if ref, err := Normalize(refOrID); err == nil {
		if img, ok := s.store.Images.Lookup(ref); ok && !img.Removed {
			return img, nil
		}
	}
	if id, ok := asID(refOrID); ok {
		if img, err := s.store.Images.Get(id); err == nil && !img.Removed {
			return img, nil
		}
	}
	if isHexPrefix(refOrID) {
		if img := s.byIDPrefix(refOrID); img != nil {
			return img, nil
		}
	}
	return nil, fmt.Errorf("image %q: %w", refOrID, ErrNotFound)
}

// byIDPrefix finds the one visible image whose digest starts with prefix, as crictl's short IDs.
func (s *Service) byIDPrefix(prefix string) *store.Image {
	matches := s.store.Images.List(func(img *store.Image) bool {
		return !img.Removed && hasHexPrefix(img.ID, prefix)
	})
	if len(matches) != 1 {
		return nil
	}
	return matches[0]
}

// List returns the visible images, optionally only the one a reference names.
func (s *Service) List(refOrID string) []*store.Image {
	if refOrID != "" {
		img, err := s.Get(refOrID)
		if err != nil {
			return nil
		}
		return []*store.Image{img}
	}
	return s.store.Images.List(func(img *store.Image) bool { return !img.Removed })
}

// InUse reports whether a container or warm pool record still needs the artifact: a created
// container will start from it, a running on-demand clone (a pool's too) reads its memory.
func (s *Service) InUse(localName string) bool {
	return len(s.store.Containers.List(func(c *store.Container) bool { return c.VM.Source == localName })) > 0 ||
		len(s.store.PoolVMs.List(func(p *store.PoolVM) bool { return p.Spec.Source == localName })) > 0
}

// Remove drops a reference, or every reference when given the image's ID. The image disappears
// from the CRI when its last reference goes; its cocoon artifact follows once no container needs
// it. A missing image is not an error.
func (s *Service) Remove(ctx context.Context, refOrID string) error {
	img, err := s.Get(refOrID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	ref, refErr := Normalize(refOrID)
	byReference := refErr == nil && slices.Contains(append(slices.Clone(img.RepoTags), img.RepoDigests...), ref)
	err = s.store.Images.Update(func(tx *store.Tx[store.Image]) error {
		rec, ok := tx.Get(img.ID)
		if !ok {
			return nil
		}
		if byReference {
			dropReference(rec, ref)
		} else {
			rec.RepoTags, rec.RepoDigests = nil, nil
		}
		if len(rec.RepoTags)+len(rec.RepoDigests) == 0 {
			rec.Removed = true
		}
		return tx.Put(rec)
	})
	if err != nil {
		return fmt.Errorf("remove image %s: %w", img.ID, err)
	}
	s.log.Info("image reference removed", "image", img.ID, "ref", refOrID)
	return s.Sweep(ctx)
}

// dropReference removes ref; when it was the repository's last tag, the repository's digest
// references go too.
func dropReference(img *store.Image, ref string) {
	img.RepoTags = slices.DeleteFunc(img.RepoTags, func(t string) bool { return t == ref })
	img.RepoDigests = slices.DeleteFunc(img.RepoDigests, func(d string) bool { return d == ref })
	repo := repository(ref)
	if slices.ContainsFunc(img.RepoTags, func(t string) bool { return repository(t) == repo }) {
		return
	}
	img.RepoDigests = slices.DeleteFunc(img.RepoDigests, func(d string) bool { return repository(d) == repo })
}

// Sweep deletes the artifacts of removed images that no container needs any more, and their
// records. It runs after removals and at startup.
func (s *Service) Sweep(ctx context.Context) error {
	var errs []error
	for _, img := range s.store.Images.List(func(img *store.Image) bool { return img.Removed }) {
		if err := s.sweepOne(ctx, img.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Service) sweepOne(ctx context.Context, id string) error {
	unlock := s.digestLocks.Lock(id)
	defer unlock()
	// Re-read under the lock: an import may have brought the image back meanwhile.
	img, err := s.store.Images.Get(id)
	if err != nil || !img.Removed || s.InUse(img.LocalName) {
		return nil
	}
	// A snapshot directory is its owner's: only the record goes.
	if !img.FromDir {
		if err := s.deleteArtifact(ctx, img.Kind, img.LocalName); err != nil {
			return err
		}
	}
	if err := s.store.Images.Delete(img.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete image record %s: %w", img.ID, err)
	}
	s.log.Info("image artifact deleted", "image", img.ID, "artifact", img.LocalName)
	return nil
}

// deleteArtifact removes a cocoon artifact; one already gone is fine.
func (s *Service) deleteArtifact(ctx context.Context, kind store.ImageKind, localName string) error {
	var err error
	if kind == store.ImageSnapshot {
		err = s.cocoon.SnapshotRemove(ctx, localName)
	} else {
		err = s.cocoon.ImageRemove(ctx, localName)
	}
	if err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		return fmt.Errorf("delete artifact %s: %w", localName, err)
	}
	return nil
}

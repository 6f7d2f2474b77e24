package imagestore

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// RegisterSnapshotDir records a snapshot directory (cocoon's snapshot export --to-dir, as a pod
// checkpoint holds one per container) as an image under ref, without bringing it into cocoon:
// its containers clone it in place (vm clone --from-dir). id names the directory's content (the
// caller derives it from what the directory describes of itself, not from its gigabytes); snap is
// its snapshot.json. The directory stays its owner's: it is only read, and removing the image
// drops the record alone. A base image the node lacks is fetched as for an import.
func (s *Service) RegisterSnapshotDir(ctx context.Context, ref, id, dir string, snap cocoon.SnapshotConfig) (*store.Image, error) {
	tag, err := NormalizeTag(ref)
	if err != nil {
		return nil, err
	}
	if _, ok := asID(id); !ok {
		return nil, fmt.Errorf("digest %q is not a sha256 digest: %w", id, ErrInvalid)
	}
	size, err := dirSize(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot directory %s: %w", dir, err)
	}
	unlock := s.digestLocks.Lock(id)
	defer unlock()
	img := &store.Image{
		ID: id, Kind: store.ImageSnapshot, LocalName: dir, FromDir: true, Size: size,
		Snapshot: snapshotInfo(snap), CreatedAt: time.Now().UnixNano(),
	}
	// A directory comes from no registry: its base only with cocoon's own credentials.
	if err := s.ensureBase(ctx, img, name.Registry{}, Credentials{}); err != nil {
		return nil, err
	}
	s.log.Info("snapshot directory registered", "image", id, "dir", dir, "bytes", size)
	return s.commit(img, tag)
}

// snapshotInfo is what a clone needs to know of a snapshot cocoon describes.
func snapshotInfo(snap cocoon.SnapshotConfig) *store.SnapshotInfo {
	info := &store.SnapshotInfo{
		CPU: snap.CPU, Memory: snap.Memory, Storage: snap.Storage, NICs: snap.NICs,
		Hypervisor: snap.Hypervisor, ImageType: snap.ImageType, Windows: snap.Windows, BaseImage: snap.Image, BaseDigest: snap.ImageDigest,
	}
	if info.Hypervisor == "" {
		info.Hypervisor = cocoon.HypervisorCloudHypervisor
	}
	return info
}

// dirSize is the bytes a directory's files take on disk: a COW disk is mostly holes.
func dirSize(dir string) (int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var size int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return 0, err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() {
			size += st.Blocks * 512
		}
	}
	return size, nil
}

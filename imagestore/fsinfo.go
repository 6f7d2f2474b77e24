package imagestore

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"
)

// The kubelet asks for filesystem usage every few seconds for eviction and image GC; walking
// cocoon's trees that often would cost more than it tells.
const (
	fsUsageInterval = 10 * time.Second
	fsUsageTimeout  = 2 * time.Minute
)

// Usage is the bytes and inodes one tree uses.
type Usage struct {
	Dir    string
	Bytes  uint64
	Inodes uint64
}

type fsUsage struct {
	Images, Containers Usage
}

// FsUsage reports what images (cocoon's root dir, without its run dir) and containers (the VMs'
// run dir with their writable disks) use on disk, at most fsUsageInterval old.
func (s *Service) FsUsage(ctx context.Context) (images, containers Usage, at time.Time, err error) {
	r := s.fs.Get(ctx)
	return r.Value.Images, r.Value.Containers, r.At, r.Err
}

// ContainersDir is cocoon's run dir, where the VMs' writable disks are: the filesystem
// ImageFsInfo reports for containers, and so the one their writable layers are on.
func (s *Service) ContainersDir() string { return s.dirs.Run }

func (s *Service) measure(ctx context.Context) (fsUsage, error) {
	images, err := diskUsage(ctx, s.dirs.Root, s.dirs.Run)
	if err != nil {
		return fsUsage{}, err
	}
	containers, err := diskUsage(ctx, s.dirs.Run, "")
	if err != nil {
		return fsUsage{}, err
	}
	return fsUsage{Images: images, Containers: containers}, nil
}

// diskUsage sums the allocated blocks (sparse disks count what they use, not their size) and the
// inodes under dir, leaving out the subtree skip. A missing dir uses nothing.
func diskUsage(ctx context.Context, dir, skip string) (Usage, error) {
	u := Usage{Dir: dir}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if skip != "" && d.IsDir() && filepath.Clean(path) == filepath.Clean(skip) {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		u.Inodes++
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			u.Bytes += uint64(st.Blocks) * 512
		}
		return nil
	})
	return u, err
}

package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/atomicfile"
	"github.com/cocoonstack/cocoon-cri/pkg/checkpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// A pod checkpoint holds each container as a snapshot directory where cocoon can write and clone
// one (Capabilities.SnapshotDirs): cocoon's snapshot export --to-dir, which reflinks the saved
// files out of cocoon's store instead of streaming a tar through cocoon-cri, and which a restore
// clones in place (vm clone --from-dir) instead of importing it into cocoon first.

// writeCheckpointDir saves c's VM and exports the snapshot into the directory path, which must not
// exist. cocoon writes it under a temporary name beside path, root's alone and noted in the
// journal, which becomes path once whole and synced. On failure nothing is left, and the snapshot
// cocoon made is deleted either way.
func (s *Runtime) writeCheckpointDir(ctx context.Context, sb *store.Sandbox, c *store.Container, path string) (*checkpoint.Metadata, error) {
	name, err := snapshotName(checkpointSnapshotPrefix, c.ID)
	if err != nil {
		return nil, err
	}
	partial := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+"."+name+".partial")
	noted, err := s.noteCheckpoint(name, partial)
	if err != nil {
		return nil, fmt.Errorf("note the checkpoint in the journal: %w", err)
	}
	defer noted()
	defer s.removeSnapshot(ctx, name, "a checkpoint")
	// The directory holds the guest's memory: whatever modes cocoon gives its files, it is root's.
	if err := os.Mkdir(partial, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", partial, err)
	}
	md, err := s.exportDir(ctx, sb, c, name, partial)
	if err == nil {
		err = syncFiles(partial)
	}
	if err == nil {
		// Never over something that appeared at path meanwhile, even an empty directory.
		if err = unix.Renameat2(unix.AT_FDCWD, partial, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); errors.Is(err, fs.ErrExist) {
			err = alreadyExists("%s exists: a checkpoint never overwrites a file", path)
		}
	}
	if err == nil {
		err = atomicfile.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		if rmErr := os.RemoveAll(partial); rmErr != nil {
			s.log.Error("could not remove a checkpoint's partial directory", "path", partial, "err", rmErr)
		}
		return nil, err
	}
	return md, nil
}

// exportDir snapshots c's VM under name and has cocoon export the snapshot into dir.
func (s *Runtime) exportDir(ctx context.Context, sb *store.Sandbox, c *store.Container, name, dir string) (*checkpoint.Metadata, error) {
	snap, err := s.saveVM(ctx, c, name)
	if err != nil {
		return nil, err
	}
	md := s.checkpointMetadata(ctx, sb, c, snap)
	if err := s.cocoon.SnapshotExportToDir(ctx, name, dir); err != nil {
		return nil, fmt.Errorf("export the snapshot into %s: %w", dir, err)
	}
	return md, nil
}

// syncFiles syncs every file of dir, and dir itself.
func syncFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = f.Sync()
		if closeErr := f.Close(); err == nil {
			err = closeErr
		}
		if err != nil {
			return fmt.Errorf("sync %s: %w", f.Name(), err)
		}
	}
	return atomicfile.SyncDir(dir)
}

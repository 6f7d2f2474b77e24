package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

var errSnapshotNotFound = errors.New("snapshot not found")

// snapshotRecord is one entry of <root>/snapshot/db/snapshots.json.
type snapshotRecord struct {
	cocoon.Snapshot
	Pending bool   `json:"pending,omitempty"`
	DataDir string `json:"data_dir,omitempty"`
}

type snapshotIndex struct {
	Snapshots map[string]*snapshotRecord `json:"snapshots"`
	Names     map[string]string          `json:"names"`
}

func (idx *snapshotIndex) initMaps() {
	if idx.Snapshots == nil {
		idx.Snapshots = map[string]*snapshotRecord{}
	}
	if idx.Names == nil {
		idx.Names = map[string]string{}
	}
}

// snapshotStore is cocoon's "localfile" snapshot backend: a directory per snapshot under
// <root>/snapshot/localfile and an index.
type snapshotStore struct {
	dataRoot string
	db       jsonDB[snapshotIndex]
}

func newSnapshotStore(conf *Config) (*snapshotStore, error) {
	base := filepath.Join(conf.RootDir, "snapshot")
	s := &snapshotStore{
		dataRoot: filepath.Join(base, "localfile"),
		db:       jsonDB[snapshotIndex]{path: filepath.Join(base, "db", "snapshots.json"), lockPath: filepath.Join(base, "db", "snapshots.lock")},
	}
	if err := ensureDirs(filepath.Join(base, "db"), s.dataRoot); err != nil {
		return nil, fmt.Errorf("init snapshot backend: ensure dirs: %w", err)
	}
	return s, nil
}

func (s *snapshotStore) dataDirOf(id string) string { return filepath.Join(s.dataRoot, id) }

// lookup resolves ref to a finished snapshot (pending ones do not exist yet).
func (idx *snapshotIndex) lookup(ref string) (*snapshotRecord, error) {
	id, err := resolveRef(idx.Snapshots, idx.Names, ref, errSnapshotNotFound)
	if err != nil {
		return nil, err
	}
	rec := idx.Snapshots[id]
	if rec == nil || rec.Pending {
		return nil, errSnapshotNotFound
	}
	return rec, nil
}

func (s *snapshotStore) inspect(ctx context.Context, ref string) (*cocoon.Snapshot, error) {
	var snap *cocoon.Snapshot
	return snap, s.db.With(ctx, func(idx *snapshotIndex) error {
		rec, err := idx.lookup(ref)
		if err != nil {
			return err
		}
		copied := rec.Snapshot
		snap = &copied
		return nil
	})
}

func (s *snapshotStore) list(ctx context.Context) ([]*cocoon.Snapshot, error) {
	var snaps []*cocoon.Snapshot
	return snaps, s.db.With(ctx, func(idx *snapshotIndex) error {
		for _, rec := range idx.Snapshots {
			if rec != nil && !rec.Pending {
				copied := rec.Snapshot
				snaps = append(snaps, &copied)
			}
		}
		return nil
	})
}

// dataDir returns a snapshot's directory and a detached copy of its config.
func (s *snapshotStore) dataDir(ctx context.Context, ref string) (string, *cocoon.SnapshotConfig, error) {
	var dir string
	var cfg *cocoon.SnapshotConfig
	return dir, cfg, s.db.With(ctx, func(idx *snapshotIndex) error {
		rec, err := idx.lookup(ref)
		if err != nil {
			return err
		}
		copied := rec.SnapshotConfig
		copied.ImageBlobIDs = maps.Clone(rec.ImageBlobIDs)
		dir, cfg = rec.DataDir, &copied
		return nil
	})
}

// create stores a snapshot taken from a VM: a pending record claims the name, the data moves
// into place, then the record is finalised (cocoon's two-phase localfile Create).
func (s *snapshotStore) create(ctx context.Context, cfg *cocoon.SnapshotConfig, srcDir string) (_ string, err error) {
	id := cfg.ID
	dataDir := s.dataDirOf(id)
	if err := s.db.Update(ctx, func(idx *snapshotIndex) error {
		if cfg.Name != "" {
			if existing, ok := idx.Names[cfg.Name]; ok {
				return fmt.Errorf("snapshot name %q already in use by %s", cfg.Name, existing)
			}
			idx.Names[cfg.Name] = id
		}
		idx.Snapshots[id] = &snapshotRecord{Snapshot: cocoon.Snapshot{SnapshotConfig: *cfg, CreatedAt: time.Now()}, Pending: true, DataDir: dataDir}
		return nil
	}); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dataDir)
			s.rollback(ctx, id, cfg.Name)
		}
	}()
	if err = moveDir(srcDir, dataDir); err != nil {
		return "", fmt.Errorf("extract snapshot data: %w", err)
	}
	if err = s.db.Update(ctx, func(idx *snapshotIndex) error {
		rec := idx.Snapshots[id]
		if rec == nil {
			return fmt.Errorf("snapshot %q disappeared from index", id)
		}
		rec.Pending = false
		return nil
	}); err != nil {
		return "", fmt.Errorf("finalize snapshot: %w", err)
	}
	return id, nil
}

func (s *snapshotStore) rollback(ctx context.Context, id, name string) {
	_ = s.db.Update(ctx, func(idx *snapshotIndex) error {
		delete(idx.Snapshots, id)
		if name != "" && idx.Names[name] == id {
			delete(idx.Names, name)
		}
		return nil
	})
}

// delete removes snapshots by ref: all refs are resolved first, then each data dir and record.
func (s *snapshotStore) delete(ctx context.Context, refs []string) ([]string, error) {
	var ids []string
	if err := s.db.With(ctx, func(idx *snapshotIndex) error {
		var err error
		ids, err = resolveRefs(idx.Snapshots, idx.Names, refs, errSnapshotNotFound)
		return err
	}); err != nil {
		return nil, err
	}
	var deleted []string
	for _, id := range ids {
		if err := os.RemoveAll(s.dataDirOf(id)); err != nil {
			return deleted, fmt.Errorf("remove data dir %s: %w", id, err)
		}
		if err := s.db.Update(ctx, func(idx *snapshotIndex) error {
			if rec := idx.Snapshots[id]; rec != nil {
				if rec.Name != "" {
					delete(idx.Names, rec.Name)
				}
				delete(idx.Snapshots, id)
			}
			return nil
		}); err != nil {
			return deleted, fmt.Errorf("delete DB record %s: %w", id, err)
		}
		deleted = append(deleted, id)
	}
	return deleted, nil
}

// moveDir renames src to dst, copying (sparse-aware) when they are on different filesystems.
func moveDir(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if err := ensureDirs(dst); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := reflinkCopy(filepath.Join(dst, e.Name()), filepath.Join(src, e.Name())); err != nil {
			return err
		}
	}
	return os.RemoveAll(src)
}

package cocoonsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// lockRetryDelay is cocoon's flock retry interval: the played release's, set by Main before any
// command runs (release.Profile.LockRetry).
var lockRetryDelay = 100 * time.Millisecond

// indexInit is implemented by index types whose maps must be non-nil after loading.
type indexInit interface{ initMaps() }

// jsonDB is cocoon's JSON file store: the whole index is read, changed and written back under an
// exclusive flock on a sibling lock file, and every write is atomic (temp file + rename), so other
// processes (and cocoon-cri reading the files) never see a torn index.
type jsonDB[T any] struct {
	path     string
	lockPath string
}

// With loads the index under the lock and passes it to fn read-only.
func (db jsonDB[T]) With(ctx context.Context, fn func(*T) error) error {
	return db.locked(ctx, func() error {
		idx, err := db.load()
		if err != nil {
			return err
		}
		return fn(idx)
	})
}

// Update loads the index under the lock, lets fn change it and writes it back if fn succeeds.
func (db jsonDB[T]) Update(ctx context.Context, fn func(*T) error) error {
	return db.locked(ctx, func() error {
		idx, err := db.load()
		if err != nil {
			return err
		}
		if err := fn(idx); err != nil {
			return err
		}
		return atomicWriteJSON(db.path, idx)
	})
}

func (db jsonDB[T]) load() (*T, error) {
	var idx T
	raw, err := os.ReadFile(db.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", db.path, err)
	default:
		if err := json.Unmarshal(raw, &idx); err != nil {
			return nil, fmt.Errorf("parse %s: %w", db.path, err)
		}
	}
	if i, ok := any(&idx).(indexInit); ok {
		i.initMaps()
	}
	return &idx, nil
}

func (db jsonDB[T]) locked(ctx context.Context, fn func() error) error {
	unlock, err := flockWait(ctx, db.lockPath)
	if err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// flockWait takes an exclusive flock on path, retrying every lockRetryDelay until ctx ends.
func flockWait(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o600) //nolint:gosec // cocoon-managed lock path
	if err != nil {
		return nil, fmt.Errorf("acquire flock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("acquire flock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("acquire flock %s: %w", path, ctx.Err())
		case <-time.After(lockRetryDelay):
		}
	}
}

// atomicWriteJSON writes v as compact JSON plus a newline via temp file, fsync and rename.
func atomicWriteJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("marshal JSON: %w", err)
	}
	return atomicWriteFile(path, append(data, '\n'), 0o644)
}

func atomicWriteFile(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write temp file: %w", err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("sync temp file: %w", err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod temp file: %w", err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close temp file: %w", err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename temp to target: %w", err)
	}
	d, err := os.Open(dir) //nolint:gosec // cocoon-managed directory
	if err != nil {
		return fmt.Errorf("sync parent dir: %w", err)
	}
	defer d.Close() //nolint:errcheck
	_ = d.Sync()
	return nil
}

// ensureDirs creates directories with cocoon's 0750 mode.
func ensureDirs(dirs ...string) error {
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create directory %s: %w", dir, err)
		}
	}
	return nil
}

package cocoonsim

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// snapshotJSONName is the first entry of a snapshot archive: a cocoon.SnapshotExport.
const snapshotJSONName = "snapshot.json"

// importArchive stores a snapshot archive (tar, gzip auto-detected). Only snapshot.json is
// checked; the data files are taken as they are, as cocoon does.
func (s *snapshotStore) importArchive(ctx context.Context, r io.Reader, name, description string) (_ string, err error) {
	tarReader, gz, err := unwrapGzip(r)
	if err != nil {
		return "", err
	}
	id := generateID()
	dataDir := s.dataDirOf(id)
	if err = os.MkdirAll(dataDir, 0o750); err != nil {
		return "", fmt.Errorf("create data dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dataDir)
		}
	}()
	if err = extractTar(dataDir, tarReader); err != nil {
		return "", fmt.Errorf("extract archive: %w", err)
	}
	if gz != nil {
		if err = gz.Close(); err != nil {
			return "", fmt.Errorf("gzip integrity check: %w", err)
		}
	}
	cfg, err := readAndRemoveSnapshotJSON(dataDir)
	if err != nil {
		return "", err
	}
	cfg.ID = id
	if name != "" {
		cfg.Name = name
	}
	if description != "" {
		cfg.Description = description
	}
	err = s.db.Update(ctx, func(idx *snapshotIndex) error {
		if cfg.Name != "" {
			if existing, ok := idx.Names[cfg.Name]; ok {
				return fmt.Errorf("snapshot name %q already in use by %s", cfg.Name, existing)
			}
			idx.Names[cfg.Name] = id
		}
		idx.Snapshots[id] = &snapshotRecord{Snapshot: cocoon.Snapshot{SnapshotConfig: *cfg, CreatedAt: time.Now()}, DataDir: dataDir}
		return nil
	})
	return id, err
}

// unwrapGzip peeks at the first two bytes and un-gzips when they are gzip's magic.
func unwrapGzip(r io.Reader) (io.Reader, *gzip.Reader, error) {
	br := bufio.NewReaderSize(r, 4096)
	peek, err := br.Peek(2)
	if err != nil {
		return nil, nil, fmt.Errorf("peek archive header: %w", err)
	}
	if peek[0] == 0x1f && peek[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("decompress: %w", err)
		}
		return gz, gz, nil
	}
	return br, nil, nil
}

func readAndRemoveSnapshotJSON(dataDir string) (*cocoon.SnapshotConfig, error) {
	path := filepath.Join(dataDir, snapshotJSONName)
	data, err := os.ReadFile(path) //nolint:gosec // snapshot data dir
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("invalid snapshot archive: %s not found", snapshotJSONName)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", snapshotJSONName, err)
	}
	var envelope cocoon.SnapshotExport
	if err := json.Unmarshal(data, &envelope); err != nil {
		return nil, fmt.Errorf("parse %s: %w", snapshotJSONName, err)
	}
	if envelope.Version != cocoon.SnapshotExportVersion {
		return nil, fmt.Errorf("unsupported snapshot archive version %d", envelope.Version)
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("remove %s from data dir: %w", snapshotJSONName, err)
	}
	return &envelope.Config, nil
}

// errEnvelopeMissing: a directory given to --from-dir has no snapshot.json (snapshot/envelope.go).
var errEnvelopeMissing = errors.New("snapshot envelope missing")

// readSnapshotEnvelope reads DIR/snapshot.json, leaving the directory as it is (cocoon's
// ReadSnapshotEnvelope).
func readSnapshotEnvelope(dir string) (*cocoon.SnapshotConfig, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapshotJSONName)) //nolint:gosec // operator-chosen directory
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s missing in %s: %w", snapshotJSONName, dir, errEnvelopeMissing)
	}
	if err != nil {
		return nil, err
	}
	var envelope cocoon.SnapshotExport
	if err := json.Unmarshal(data, &envelope); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, snapshotJSONName), err)
	}
	if envelope.Version != cocoon.SnapshotExportVersion {
		return nil, fmt.Errorf("unsupported snapshot envelope version %d (want %d)", envelope.Version, cocoon.SnapshotExportVersion)
	}
	return &envelope.Config, nil
}

// marshalEnvelope is snapshot.json: the first entry of an archive, the last file of an export to
// a directory.
func marshalEnvelope(cfg *cocoon.SnapshotConfig) ([]byte, error) {
	meta, err := json.MarshalIndent(cocoon.SnapshotExport{Config: *cfg, Version: cocoon.SnapshotExportVersion}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal snapshot metadata: %w", err)
	}
	return append(meta, '\n'), nil
}

// exportToDir copies a snapshot's files into dir (created when absent, refused when not empty),
// reflinked where the filesystem can, and writes snapshot.json last, so that its presence says the
// data is whole (cocoon's localfile ExportToDir). What a failure copied stays, as in cocoon.
func (s *snapshotStore) exportToDir(ctx context.Context, ref, dir string) error {
	dataDir, cfg, err := s.dataDir(ctx, ref)
	if err != nil {
		return err
	}
	if err := ensureDirs(dir); err != nil {
		return err
	}
	existing, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	if len(existing) > 0 {
		return fmt.Errorf("target dir %s is not empty", dir)
	}
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return fmt.Errorf("read snapshot dir: %w", err)
	}
	var g errgroup.Group
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		g.Go(func() error {
			if err := reflinkCopy(filepath.Join(dir, e.Name()), filepath.Join(dataDir, e.Name())); err != nil {
				return fmt.Errorf("copy %s: %w", e.Name(), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	meta, err := marshalEnvelope(cfg)
	if err == nil {
		err = atomicWriteFile(filepath.Join(dir, snapshotJSONName), meta, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write envelope: %w", err)
	}
	return nil
}

// writeArchive writes a snapshot as cocoon exports it: snapshot.json first, then the data files
// (sparse ones with cocoon's PAX records), optionally gzip-compressed at BestSpeed.
func writeArchive(w io.Writer, dataDir string, cfg *cocoon.SnapshotConfig, compress bool) error {
	meta, err := marshalEnvelope(cfg)
	if err != nil {
		return err
	}
	var gz *gzip.Writer
	if compress {
		if gz, err = gzip.NewWriterLevel(w, gzip.BestSpeed); err != nil {
			return fmt.Errorf("create gzip writer: %w", err)
		}
		w = gz
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: snapshotJSONName, Size: int64(len(meta)), Mode: 0o644, ModTime: time.Now()}); err != nil {
		return err
	}
	if _, err := tw.Write(meta); err != nil {
		return err
	}
	if err := tarDir(tw, dataDir); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if gz != nil {
		return gz.Close()
	}
	return nil
}

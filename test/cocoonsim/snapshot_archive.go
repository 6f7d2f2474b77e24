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

// writeArchive writes a snapshot as cocoon exports it: snapshot.json first, then the data files
// (sparse ones with cocoon's PAX records), optionally gzip-compressed at BestSpeed.
func writeArchive(w io.Writer, dataDir string, cfg *cocoon.SnapshotConfig, compress bool) error {
	meta, err := json.MarshalIndent(cocoon.SnapshotExport{Config: *cfg, Version: cocoon.SnapshotExportVersion}, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal snapshot metadata: %w", err)
	}
	meta = append(meta, '\n')
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

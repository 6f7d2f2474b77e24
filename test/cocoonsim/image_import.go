package cocoonsim

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// importSource is what a local import file holds, by its magic bytes.
type importSource int

const (
	importQcow2 importSource = iota
	importTar
	importGzip // treated as a stream: un-gzipped, then qcow2 or tar
)

// imageImport is "image import NAME [FILE...]": qcow2 becomes a cloud image, tar an OCI image
// (one layer per tar), gzip-wrapped input is accepted; without FILE it reads stdin.
func (a *app) imageImport(cmd *cobra.Command, args []string) error {
	logger := a.log.with("cmd.image.import")
	name, files := args[0], args[1:]
	if len(files) == 0 {
		logger.Infof("importing from stdin ...")
		return a.importImageStream(cmd, name, cmd.InOrStdin())
	}
	kind, err := detectImportFile(files[0])
	if err != nil {
		return err
	}
	switch kind {
	case importQcow2:
		store, err := newCloudimgStore(a.conf.RootDir)
		if err != nil {
			return fmt.Errorf("init cloudimg backend: %w", err)
		}
		logger.Infof("importing qcow2 file %s ...", files[0])
		if err := store.importFiles(cmd.Context(), name, files); err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
	case importTar:
		store, err := newOCIStore(a.conf.RootDir)
		if err != nil {
			return fmt.Errorf("init oci backend: %w", err)
		}
		logger.Infof("importing tar file %s ...", files[0])
		if err := importOCIFiles(cmd, store, name, files); err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
	default:
		if len(files) > 1 {
			return fmt.Errorf("stream imports accept exactly one file, got %d", len(files))
		}
		f, err := os.Open(files[0]) //nolint:gosec // operator-supplied import file
		if err != nil {
			return fmt.Errorf("open %s: %w", files[0], err)
		}
		defer f.Close() //nolint:errcheck
		a.log.with("cmd.images.importLocalStream").Infof("importing from %s ...", files[0])
		return a.importImageStream(cmd, name, f)
	}
	logger.Infof("done: %s", name)
	return nil
}

func importOCIFiles(cmd *cobra.Command, store *ociStore, name string, files []string) error {
	readers := make([]io.Reader, 0, len(files))
	for _, path := range files {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("file %s: %w", path, err)
		}
	}
	for _, path := range files {
		f, err := os.Open(path) //nolint:gosec // operator-supplied import file
		if err != nil {
			return fmt.Errorf("process layers: open %s: %w", path, err)
		}
		defer f.Close() //nolint:errcheck
		readers = append(readers, f)
	}
	_, err := store.importLayers(cmd.Context(), name, "process layers", readers, true)
	return err
}

// importImageStream detects a stream's type (after un-gzipping) and imports it.
func (a *app) importImageStream(cmd *cobra.Command, name string, r io.Reader) error {
	br := bufio.NewReaderSize(r, 8192)
	peek, err := br.Peek(2)
	if err != nil {
		return fmt.Errorf("detect image type: peek: %w", err)
	}
	inner := br
	if peek[0] == 0x1f && peek[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("detect image type: gzip: %w", err)
		}
		defer gz.Close() //nolint:errcheck
		inner = bufio.NewReaderSize(gz, 8192)
	}
	content, err := inner.Peek(4)
	if err != nil {
		return fmt.Errorf("detect image type: peek content: %w", err)
	}
	if bytes.Equal(content, qcow2Magic) {
		store, err := newCloudimgStore(a.conf.RootDir)
		if err != nil {
			return fmt.Errorf("init cloudimg backend: %w", err)
		}
		if err := store.importReader(cmd.Context(), name, inner); err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
		return nil
	}
	store, err := newOCIStore(a.conf.RootDir)
	if err != nil {
		return fmt.Errorf("init oci backend: %w", err)
	}
	if _, err := store.importLayers(cmd.Context(), name, "process layer", []io.Reader{inner}, true); err != nil {
		return fmt.Errorf("import %s: %w", name, err)
	}
	return nil
}

// detectImportFile classifies a local import file by its first bytes.
func detectImportFile(path string) (importSource, error) {
	f, err := os.Open(path) //nolint:gosec // operator-supplied import file
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck
	magic := make([]byte, 4)
	n, _ := io.ReadFull(f, magic)
	switch {
	case n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		return importGzip, nil
	case n == 4 && bytes.Equal(magic, qcow2Magic):
		return importQcow2, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("seek %s: %w", path, err)
	}
	if _, err := tar.NewReader(f).Next(); err != nil {
		return 0, fmt.Errorf("cannot detect file type for %s (expected qcow2 or tar)", path)
	}
	return importTar, nil
}

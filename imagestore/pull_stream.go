package imagestore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// pullSnapshot streams a snapshot artifact into `cocoon snapshot import` as the archive cocoon
// exported.
func (s *Service) pullSnapshot(ctx context.Context, blobs blobOpener, art *artifact, progress *pullProgress) (*store.Image, error) {
	total := art.manifest.Config.Size
	for _, l := range art.manifest.Layers {
		total += l.Size
	}
	progress.setTotal(total)
	return s.importStream(ctx, art.id, store.ImageSnapshot, progress, func(ctx context.Context, w io.Writer) error {
		cfg, err := fetchSnapshotConfig(ctx, blobs, art.manifest.Config, progress)
		if err != nil {
			return err
		}
		return writeSnapshotArchive(ctx, w, LocalName(art.id), cfg, art.manifest.Layers, blobs, progress)
	})
}

// pullCloudImage streams a cloud image's disk into `cocoon image import`.
func (s *Service) pullCloudImage(ctx context.Context, blobs blobOpener, art *artifact, progress *pullProgress) (*store.Image, error) {
	disks, err := diskLayers(art.manifest)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	progress.setTotal(total)
	return s.importStream(ctx, art.id, store.ImageCloud, progress, func(ctx context.Context, w io.Writer) error {
		return writeDiskImage(ctx, w, disks, blobs, progress)
	})
}

// errImportStopped tells a producer that the import stopped reading.
var errImportStopped = errors.New("the import stopped reading")

// importStream imports what produce writes, through a pipe, so no blob is ever held whole: a
// producer that fails (a corrupt or truncated blob) fails the import, an import that fails stops
// the producer, and either way no artifact is left. The stream must be the kind the manifest
// says: a cloud image's disk must be a qcow2, which is all `cocoon image import` takes for a disk.
// Stalls are watched while produce runs, not while cocoon finishes the import.
func (s *Service) importStream(ctx context.Context, id string, kind store.ImageKind, progress *pullProgress, produce func(context.Context, io.Writer) error) (*store.Image, error) {
	ctx, stopWatch := progress.watch(ctx)
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := produce(ctx, pw)
		stopWatch()
		pw.CloseWithError(err)
		produced <- err
	}()
	img, err := s.importChecked(ctx, id, kind, pr)
	pr.CloseWithError(errImportStopped)
	// The producer's failure explains a failed import better than what cocoon made of the
	// truncated stream.
	if streamErr := <-produced; streamErr != nil && !errors.Is(streamErr, errImportStopped) && err != nil {
		err = streamErr
	}
	if err != nil {
		return nil, err
	}
	return img, nil
}

func (s *Service) importChecked(ctx context.Context, id string, kind store.ImageKind, r io.Reader) (*store.Image, error) {
	br := bufio.NewReaderSize(r, peekSize)
	got, err := detectKind(br)
	if err != nil {
		return nil, fmt.Errorf("%s content: %w", kind, err)
	}
	if got != kind {
		return nil, fmt.Errorf("a %s artifact whose content is a %s: %w", kind, got, ErrInvalid)
	}
	return s.importArtifact(ctx, id, kind, br, nil)
}

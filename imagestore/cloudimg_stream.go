package imagestore

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// diskLayers are a cloud image's disk layers in title order: a disk too big for one layer is split
// into parts whose titles sort in sequence. Other layers (checksums, notes) are not the disk.
func diskLayers(m *v1.Manifest) ([]v1.Descriptor, error) {
	var disks []v1.Descriptor
	for _, l := range m.Layers {
		if diskMediaTypes[l.MediaType] {
			disks = append(disks, l)
		}
	}
	if len(disks) == 0 {
		return nil, fmt.Errorf("cloud image manifest has no disk layer: %w", ErrInvalid)
	}
	slices.SortStableFunc(disks, func(a, b v1.Descriptor) int { return cmp.Compare(title(a), title(b)) })
	return disks, nil
}

// writeDiskImage writes the disk the layers hold, one after the other.
func writeDiskImage(ctx context.Context, w io.Writer, disks []v1.Descriptor, blobs blobOpener, counter io.Writer) error {
	for _, d := range disks {
		if err := copyBlob(ctx, w, blobs, d, counter); err != nil {
			return fmt.Errorf("disk part %q: %w", title(d), err)
		}
	}
	return nil
}

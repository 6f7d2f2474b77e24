package registry

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PushCloudImage pushes a disk image under repoTag the way cloud images reach epoch (oras or crane,
// as the windows builder publishes them): an empty config, the disk in parts qcow2 layers titled
// <name>.qcow2.NN.qcow2.part (one disk.qcow2 layer when parts is 1), listed in the manifest in
// reverse order so that only their titles give the order, plus a SHA256SUMS layer that is not
// part of the disk.
func (t Target) PushCloudImage(ctx context.Context, repoTag string, disk []byte, parts int) (Pushed, error) {
	ref, err := t.ref(repoTag)
	if err != nil {
		return Pushed{}, err
	}
	if parts < 1 || parts > len(disk) {
		return Pushed{}, fmt.Errorf("cannot split %d bytes into %d parts", len(disk), parts)
	}
	pushed := Pushed{Ref: ref.String(), Blobs: map[string]string{}}
	var layers []epochDescriptor
	sums := ""
	partSize := (len(disk) + parts - 1) / parts
	for i := range parts {
		part := disk[i*partSize : min((i+1)*partSize, len(disk))]
		mediaType, title := mediaTypeDiskQcow2Part, fmt.Sprintf("disk.qcow2.%02d.qcow2.part", i)
		if parts == 1 {
			mediaType, title = mediaTypeDiskQcow2, "disk.qcow2"
		}
		b := bytesBlob(mediaType, part)
		if err := t.pushBlob(ctx, ref.Context(), b); err != nil {
			return Pushed{}, err
		}
		layers = append(layers, b.epochDescriptor(title))
		pushed.Blobs[title] = b.digest.String()
		sums += fmt.Sprintf("%x  %s\n", sha256.Sum256(part), title)
	}
	slices.Reverse(layers)
	checksums := bytesBlob("text/plain", []byte(sums))
	empty := bytesBlob(mediaTypeEmptyConfig, []byte("{}"))
	for _, b := range []*blob{checksums, empty} {
		if err := t.pushBlob(ctx, ref.Context(), b); err != nil {
			return Pushed{}, err
		}
	}
	pushed.Digest, err = t.putManifest(ctx, ref, epochManifest{
		SchemaVersion: 2,
		MediaType:     string(types.OCIManifestSchema1),
		ArtifactType:  artifactTypeOSImage,
		Config:        empty.epochDescriptor(""),
		Layers:        append(layers, checksums.epochDescriptor("SHA256SUMS")),
	}, types.OCIManifestSchema1)
	return pushed, err
}

package registry

import (
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch's artifact formats, written down here independently of cocoon-cri's reader
// (docs/cocoon-contract.md section 4; epoch's manifest/media.go and manifest/types.go), so
// that a test compares two readings of the contract rather than one with itself.
const (
	artifactTypeSnapshot = "application/vnd.cocoonstack.snapshot.v1+json"
	artifactTypeOSImage  = "application/vnd.cocoonstack.os-image.v1+json"

	mediaTypeSnapshotConfig types.MediaType = "application/vnd.cocoonstack.snapshot.config.v1+json"
	mediaTypeEmptyConfig    types.MediaType = "application/vnd.oci.empty.v1+json"
	mediaTypeDiskQcow2      types.MediaType = "application/vnd.cocoonstack.disk.qcow2"
	mediaTypeDiskQcow2Part  types.MediaType = "application/vnd.cocoonstack.disk.qcow2.part"
	mediaTypeDiskRaw        types.MediaType = "application/vnd.cocoonstack.disk.raw"

	titleAnnotation   = "org.opencontainers.image.title"
	createdAnnotation = "org.opencontainers.image.created"

	snapshotJSON  = "snapshot.json"
	paxSparseMap  = "COCOON.sparse.map"
	paxSparseSize = "COCOON.sparse.size"
)

// epochManifest is epoch's manifest.OCIManifest, fields in its order.
type epochManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        epochDescriptor   `json:"config"`
	Layers        []epochDescriptor `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// epochDescriptor is epoch's manifest.Descriptor.
type epochDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func (b *blob) epochDescriptor(title string) epochDescriptor {
	d := epochDescriptor{MediaType: string(b.mediaType), Digest: b.digest.String(), Size: b.size}
	if title != "" {
		d.Annotations = map[string]string{titleAnnotation: title}
	}
	return d
}

// epochSnapshotConfig is epoch's manifest.SnapshotConfig, the snapshot's config blob.
type epochSnapshotConfig struct {
	SchemaVersion string                       `json:"schemaVersion"`
	SnapshotID    string                       `json:"snapshotId"`
	Description   string                       `json:"description,omitempty"`
	Image         string                       `json:"image,omitempty"`
	ImageDigest   string                       `json:"imageDigest,omitempty"`
	ImageType     string                       `json:"imageType,omitempty"`
	ImageBlobIDs  map[string]struct{}          `json:"imageBlobIds,omitempty"`
	Hypervisor    string                       `json:"hypervisor,omitempty"`
	CPU           int                          `json:"cpu,omitempty"`
	Memory        int64                        `json:"memory,omitempty"`
	Storage       int64                        `json:"storage,omitempty"`
	NICs          int                          `json:"nics,omitempty"`
	Network       string                       `json:"network,omitempty"`
	Windows       bool                         `json:"windows,omitempty"`
	Files         map[string]epochSnapshotFile `json:"files,omitempty"`
	CreatedAt     time.Time                    `json:"createdAt"`
}

// epochSnapshotFile is epoch's manifest.SnapshotFile: a tar entry's mode and sparse records.
type epochSnapshotFile struct {
	Mode       int64  `json:"mode,omitempty"`
	SparseMap  string `json:"sparseMap,omitempty"`
	SparseSize int64  `json:"sparseSize,omitempty"`
}

// snapshotFileMediaType is epoch's MediaTypeForCocoonFile.
func snapshotFileMediaType(name string) types.MediaType {
	switch name {
	case "config.json":
		return "application/vnd.cocoonstack.vm.config+json"
	case "state.json":
		return "application/vnd.cocoonstack.vm.state+json"
	case "memory-ranges":
		return "application/vnd.cocoonstack.vm.memory"
	case "cidata.img":
		return "application/vnd.cocoonstack.vm.cidata"
	}
	switch {
	case strings.HasSuffix(name, ".qcow2"):
		return mediaTypeDiskQcow2
	case strings.HasSuffix(name, ".raw"):
		return mediaTypeDiskRaw
	}
	return "application/octet-stream"
}

package imagestore

import (
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// epoch's artifact formats (docs/cocoon-contract.md section 4): a manifest's artifactType
// says what it carries.
const (
	artifactTypeSnapshot = "application/vnd.cocoonstack.snapshot.v1+json"
	artifactTypeOSImage  = "application/vnd.cocoonstack.os-image.v1+json"
	// artifactTypeWindowsImage is the cloud image's legacy name, still recognised by epoch.
	artifactTypeWindowsImage = "application/vnd.cocoonstack.windows-image.v1+json"

	mediaTypeSnapshotConfig types.MediaType = "application/vnd.cocoonstack.snapshot.config.v1+json"
	// snapshotConfigSchema is the config blob's schemaVersion.
	snapshotConfigSchema = "v1"

	mediaTypeDiskQcow2 types.MediaType = "application/vnd.cocoonstack.disk.qcow2"
	mediaTypeDiskRaw   types.MediaType = "application/vnd.cocoonstack.disk.raw"

	// annotationTitle names the file a layer holds.
	annotationTitle = "org.opencontainers.image.title"
	// annotationCreated is when the artifact was made (RFC 3339), a manifest annotation.
	annotationCreated = "org.opencontainers.image.created"

	// maxConfigSize bounds a snapshot config blob, which is a few KiB.
	maxConfigSize = 1 << 20
)

// AnnotationCheckpoint is the manifest annotation of a snapshot pushed from a checkpoint archive:
// the checkpoint's metadata (pkg/checkpoint.Metadata) as JSON. Pulls ignore it.
const AnnotationCheckpoint = "io.cocoonstack.cri.checkpoint"

// diskMediaTypes are a cloud image's disk layers; the .part ones are pieces of a split disk.
var diskMediaTypes = map[types.MediaType]bool{
	"application/vnd.cocoonstack.disk.qcow2":              true,
	"application/vnd.cocoonstack.disk.qcow2.part":         true,
	"application/vnd.cocoonstack.disk.raw":                true,
	"application/vnd.cocoonstack.disk.raw.part":           true,
	"application/vnd.cocoonstack.windows.disk.qcow2":      true,
	"application/vnd.cocoonstack.windows.disk.qcow2.part": true,
	"application/vnd.cocoonstack.windows.disk.raw":        true,
	"application/vnd.cocoonstack.windows.disk.raw.part":   true,
}

// classify tells what a manifest is: a cocoon snapshot, a cloud image, or anything else, which
// cocoon pulls itself as an OCI VM image.
func classify(m *v1.Manifest) store.ImageKind {
	switch m.ArtifactType {
	case artifactTypeSnapshot:
		return store.ImageSnapshot
	case artifactTypeOSImage, artifactTypeWindowsImage:
		return store.ImageCloud
	}
	return store.ImageOCI
}

// title is the file name a layer carries.
func title(d v1.Descriptor) string { return d.Annotations[annotationTitle] }

// snapshotFileMediaType is the media type of the layer holding a snapshot's file, as epoch's
// MediaTypeForCocoonFile gives it (docs/cocoon-contract.md section 4). The pull goes by the
// layers' titles, not by these.
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

// plainFileName reports whether a layer title can name a file of a snapshot directory: cocoon
// extracts entries flat, and snapshot.json is the archive's own.
func plainFileName(s string) bool {
	return s != "" && s != "." && s != ".." && s == filepath.Base(s) && s != snapshotManifest
}

// snapshotConfig is epoch's snapshot config blob: the snapshot's description and, per file, what
// the tar entry's header held.
type snapshotConfig struct {
	SchemaVersion string                  `json:"schemaVersion,omitempty"`
	SnapshotID    string                  `json:"snapshotId"`
	Description   string                  `json:"description,omitempty"`
	Image         string                  `json:"image,omitempty"`
	ImageDigest   string                  `json:"imageDigest,omitempty"`
	ImageType     string                  `json:"imageType,omitempty"`
	ImageBlobIDs  map[string]struct{}     `json:"imageBlobIds,omitempty"`
	Hypervisor    string                  `json:"hypervisor,omitempty"`
	CPU           int                     `json:"cpu,omitempty"`
	Memory        int64                   `json:"memory,omitempty"`
	Storage       int64                   `json:"storage,omitempty"`
	NICs          int                     `json:"nics,omitempty"`
	Network       string                  `json:"network,omitempty"`
	Windows       bool                    `json:"windows,omitempty"`
	Files         map[string]snapshotFile `json:"files,omitempty"`
	CreatedAt     time.Time               `json:"createdAt"`
}

type snapshotFile struct {
	Mode       int64  `json:"mode,omitempty"`
	SparseMap  string `json:"sparseMap,omitempty"`
	SparseSize int64  `json:"sparseSize,omitempty"`
}

// newSnapshotConfig is the config blob of a snapshot that snapshot.json describes: the inverse of
// exportConfig. The local name stays behind (a pull names the snapshot after the digest).
func newSnapshotConfig(c cocoon.SnapshotConfig, files map[string]snapshotFile, createdAt time.Time) *snapshotConfig {
	return &snapshotConfig{
		SchemaVersion: snapshotConfigSchema,
		SnapshotID:    c.ID, Description: c.Description, Image: c.Image, ImageDigest: c.ImageDigest,
		ImageType: c.ImageType, ImageBlobIDs: c.ImageBlobIDs, Hypervisor: c.Hypervisor,
		CPU: c.CPU, Memory: c.Memory, Storage: c.Storage, NICs: c.NICs, Network: c.Network, Windows: c.Windows,
		Files: files, CreatedAt: createdAt.UTC(),
	}
}

// uncarried names the settings of snapshot.json that epoch's config blob has no field for and that
// c sets: a pulled snapshot has cocoon's defaults for them instead.
func uncarried(c cocoon.SnapshotConfig) []string {
	var lost []string
	for _, s := range []struct {
		name string
		set  bool
	}{
		{"queue_size", c.QueueSize != 0},
		{"disk_queue_size", c.DiskQueueSize != 0},
		{"no_direct_io", c.NoDirectIO},
		{"shared_memory", c.SharedMemory},
	} {
		if s.set {
			lost = append(lost, s.name)
		}
	}
	return lost
}

// exportConfig is snapshot.json's description under the local name. Settings epoch does not carry
// (queue sizes, direct I/O) take cocoon's defaults.
func (c *snapshotConfig) exportConfig(localName string) cocoon.SnapshotConfig {
	return cocoon.SnapshotConfig{
		Config: cocoon.Config{
			CPU: c.CPU, Memory: c.Memory, Storage: c.Storage, Image: c.Image, ImageDigest: c.ImageDigest,
			ImageType: c.ImageType, Network: c.Network, Windows: c.Windows,
		},
		ID: c.SnapshotID, Name: localName, Description: c.Description, ImageBlobIDs: c.ImageBlobIDs,
		Hypervisor: c.Hypervisor, NICs: c.NICs,
	}
}

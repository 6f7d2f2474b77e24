// Package checkpoint is the format of cocoon-cri's checkpoint archives: a cocoon snapshot export
// with the checkpoint's metadata in front of it.
//
// An archive is one tar stream. Its first entry is MetadataName, a USTAR regular file holding
// Metadata as JSON; the entries after it are `cocoon snapshot export`'s archive, byte for byte,
// trailer included. Stripping the first entry therefore gives back exactly what cocoon exported,
// which is what cocoon-cri feeds `cocoon snapshot import`; cocoon itself would also take the whole
// archive, keeping the metadata as one more file of the snapshot.
package checkpoint

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// MetadataName is the first entry of a checkpoint archive.
const MetadataName = "cocoon-cri-checkpoint.json"

// FormatVersion is the version of Metadata this cocoon-cri writes and reads.
const FormatVersion = 1

// maxMetadataSize bounds the metadata entry read from an archive of unknown origin.
const maxMetadataSize = 1 << 20

// blockSize is tar's record unit: a header, and a file's data padded to it.
const blockSize = 512

// ErrInvalid marks a checkpoint, archive or pod checkpoint, that cocoon-cri cannot read.
var ErrInvalid = errors.New("invalid checkpoint")

// Metadata says what a checkpoint holds and where it came from.
type Metadata struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"createdAt"`
	Pod       Pod       `json:"pod"`
	Container Container `json:"container"`
	// CocoonVersion and Hypervisor are the node's when the VM was saved; a clone of the
	// snapshot needs that hypervisor.
	CocoonVersion string `json:"cocoonVersion,omitempty"`
	Hypervisor    string `json:"hypervisor"`
	// BaseImage is the image the snapshot's VM was first made from, as cocoon recorded it.
	BaseImage string `json:"baseImage,omitempty"`
	// CPU, MemoryBytes and StorageBytes are the VM's size, which a clone of it keeps.
	CPU          int   `json:"cpu,omitempty"`
	MemoryBytes  int64 `json:"memoryBytes,omitempty"`
	StorageBytes int64 `json:"storageBytes,omitempty"`
}

// Pod identifies the checkpointed pod.
type Pod struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	SandboxID string `json:"sandboxId"`
}

// Container identifies the checkpointed container and the image it ran.
type Container struct {
	Name     string `json:"name"`
	ID       string `json:"id"`
	Image    string `json:"image"`
	ImageRef string `json:"imageRef,omitempty"`
}

// Write writes a checkpoint archive to w: md, then what export writes, which must be a whole
// snapshot export archive.
func Write(w io.Writer, md *Metadata, export func(io.Writer) error) error {
	data, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return fmt.Errorf("encode checkpoint metadata: %w", err)
	}
	tw := tar.NewWriter(w)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     MetadataName,
		Mode:     0o600,
		Size:     int64(len(data)),
		ModTime:  md.CreatedAt.Truncate(time.Second),
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write checkpoint metadata header: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write checkpoint metadata: %w", err)
	}
	// Flush pads the entry without the end-of-archive trailer: the export's entries follow.
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write checkpoint metadata: %w", err)
	}
	return export(w)
}

// Read takes the metadata entry off the front of br when it is there. It returns the metadata (nil
// for an archive without it, such as a plain snapshot export, of which nothing is consumed) and
// leaves br at the snapshot export's first byte.
func Read(br *bufio.Reader) (*Metadata, error) {
	if br.Size() < blockSize {
		return nil, fmt.Errorf("checkpoint: reader buffer %d smaller than a tar block", br.Size())
	}
	block, err := br.Peek(blockSize)
	if err != nil {
		// Shorter than one tar block: not ours, and whoever reads on will say what it is.
		return nil, nil //nolint:nilerr // a short stream simply has no metadata entry
	}
	hdr, err := tar.NewReader(bytes.NewReader(block)).Next()
	if err != nil || hdr.Name != MetadataName {
		return nil, nil //nolint:nilerr // not a tar, or not ours: a plain archive
	}
	if hdr.Typeflag != tar.TypeReg || hdr.Size <= 0 || hdr.Size > maxMetadataSize {
		return nil, fmt.Errorf("%w: %s is not a regular file of at most %d bytes", ErrInvalid, MetadataName, maxMetadataSize)
	}
	if _, err := br.Discard(blockSize); err != nil {
		return nil, err
	}
	data := make([]byte, hdr.Size)
	if _, err := io.ReadFull(br, data); err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrInvalid, MetadataName, err)
	}
	if pad := (blockSize - hdr.Size%blockSize) % blockSize; pad > 0 {
		if _, err := br.Discard(int(pad)); err != nil {
			return nil, fmt.Errorf("%w: read %s: %v", ErrInvalid, MetadataName, err)
		}
	}
	var md Metadata
	if err := json.Unmarshal(data, &md); err != nil {
		return nil, fmt.Errorf("%w: decode %s: %v", ErrInvalid, MetadataName, err)
	}
	if md.Version != FormatVersion {
		return nil, fmt.Errorf("%w: metadata version %d, this cocoon-cri reads %d", ErrInvalid, md.Version, FormatVersion)
	}
	return &md, nil
}

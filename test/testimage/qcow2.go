package testimage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// qcow2 layout constants: 64 KiB clusters, 16-bit refcounts (qemu-img's defaults).
const (
	qcow2ClusterBits   = 16
	qcow2ClusterSize   = 1 << qcow2ClusterBits
	qcow2RefcountOrder = 4
	qcow2HeaderLength  = 104
	qcow2L2Entries     = qcow2ClusterSize / 8
	qcow2RefcountsPer  = qcow2ClusterSize * 8 >> qcow2RefcountOrder
	// qcow2ExtHeader is a header extension's type and length; the data is padded to 8 bytes
	// and the area ends with an all-zero extension header.
	qcow2ExtHeader = 8
)

// WriteQCOW2 writes an empty qcow2 version 3 image of the given virtual size without a backing
// file: the form cocoon stores as-is on `image import` (no qemu-img needed), and one that
// `qemu-img info` and `qemu-img check` accept. Every guest cluster is unallocated (reads as zero).
// VMs booted from it get the default guest; WriteQCOW2WithGuest gives them another behaviour.
//
// Layout: cluster 0 header (and header extensions), cluster 1 refcount table, cluster 2 refcount
// block, clusters 3.. L1 table. The file is (3 + L1 clusters) * 64 KiB long.
func WriteQCOW2(w io.Writer, virtualSize int64) error {
	return WriteQCOW2WithGuest(w, virtualSize, guest.Spec{})
}

// WriteQCOW2WithGuest is WriteQCOW2 for a cloud image whose VMs behave as spec says. A qcow2 has
// no file system to carry the behaviour file, so a non-zero spec goes, as JSON, into a header
// extension of type guest.QCOW2SpecExtension right after the header, where the simulator finds
// it when it creates a VM from the image. QEMU skips extension types it does not know, and
// `qemu-img convert` does not copy them: an image cocoon converts on import loses the spec.
func WriteQCOW2WithGuest(w io.Writer, virtualSize int64, spec guest.Spec) error {
	if virtualSize <= 0 {
		return fmt.Errorf("qcow2 virtual size must be positive, got %d", virtualSize)
	}
	var specJSON []byte
	if !spec.IsZero() {
		if err := spec.Validate(); err != nil {
			return fmt.Errorf("guest behaviour: %w", err)
		}
		var err error
		if specJSON, err = json.Marshal(spec); err != nil {
			return fmt.Errorf("marshal guest behaviour: %w", err)
		}
		if room := qcow2ClusterSize - qcow2HeaderLength - 2*qcow2ExtHeader; len(specJSON) > room {
			return fmt.Errorf("guest behaviour is %d bytes of JSON, more than the %d a qcow2 header cluster holds", len(specJSON), room)
		}
	}
	l2Coverage := int64(qcow2ClusterSize) * qcow2L2Entries
	l1Size := (virtualSize + l2Coverage - 1) / l2Coverage
	l1Clusters := (l1Size*8 + qcow2ClusterSize - 1) / qcow2ClusterSize
	totalClusters := 3 + l1Clusters
	if totalClusters > qcow2RefcountsPer {
		return fmt.Errorf("qcow2 virtual size %d too large for a single refcount block", virtualSize)
	}

	image := make([]byte, totalClusters*qcow2ClusterSize)
	be := binary.BigEndian
	hdr := image[:qcow2HeaderLength]
	copy(hdr[0:4], "QFI\xfb")
	be.PutUint32(hdr[4:], 3)                                   // version
	be.PutUint32(hdr[20:], qcow2ClusterBits)                   // cluster_bits
	be.PutUint64(hdr[24:], uint64(virtualSize))                // size
	be.PutUint32(hdr[36:], uint32(l1Size))                     // l1_size
	be.PutUint64(hdr[40:], 3*qcow2ClusterSize)                 // l1_table_offset
	be.PutUint64(hdr[48:], 1*qcow2ClusterSize)                 // refcount_table_offset
	be.PutUint32(hdr[56:], 1)                                  // refcount_table_clusters
	be.PutUint32(hdr[96:], qcow2RefcountOrder)                 // refcount_order
	be.PutUint32(hdr[100:], qcow2HeaderLength)                 // header_length
	be.PutUint64(image[qcow2ClusterSize:], 2*qcow2ClusterSize) // refcount table -> block
	if specJSON != nil {
		// The zeros after the padded data are the end-of-area marker.
		ext := image[qcow2HeaderLength:]
		be.PutUint32(ext, guest.QCOW2SpecExtension)
		be.PutUint32(ext[4:], uint32(len(specJSON))) //nolint:gosec // bounded by the cluster size above
		copy(ext[qcow2ExtHeader:], specJSON)
	}
	block := image[2*qcow2ClusterSize:]
	for c := range totalClusters {
		be.PutUint16(block[c*2:], 1) // every metadata cluster is used once
	}
	_, err := w.Write(image)
	return err
}

func qcow2Bytes(virtualSize int64) ([]byte, error) {
	var buf bytes.Buffer
	if err := WriteQCOW2(&buf, virtualSize); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

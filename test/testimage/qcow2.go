package testimage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// qcow2 layout constants: 64 KiB clusters, 16-bit refcounts (qemu-img's defaults).
const (
	qcow2ClusterBits   = 16
	qcow2ClusterSize   = 1 << qcow2ClusterBits
	qcow2RefcountOrder = 4
	qcow2HeaderLength  = 104
	qcow2L2Entries     = qcow2ClusterSize / 8
	qcow2RefcountsPer  = qcow2ClusterSize * 8 >> qcow2RefcountOrder
)

// WriteQCOW2 writes an empty qcow2 version 3 image of the given virtual size without a backing
// file: the form cocoon stores as-is on `image import` (no qemu-img needed), and one that
// `qemu-img info` and `qemu-img check` accept. Every guest cluster is unallocated (reads as zero).
//
// Layout: cluster 0 header, cluster 1 refcount table, cluster 2 refcount block, clusters 3.. L1
// table. The file is (3 + L1 clusters) * 64 KiB long.
func WriteQCOW2(w io.Writer, virtualSize int64) error {
	if virtualSize <= 0 {
		return fmt.Errorf("qcow2 virtual size must be positive, got %d", virtualSize)
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

package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// QCOW2SpecExtension is the qcow2 header extension type that carries a cloud image's guest
// behaviour (the JSON of SpecFile), since a qcow2 has no file system the simulator could look
// into. qcow2 readers must skip extension types they do not know, so QEMU still opens, checks
// and backs overlays with such an image. The value is ASCII "csim"; it is none of the types
// QEMU defines (0 end of area, 0xe2792aca backing format, 0x6803f857 feature names, 0x23852875
// bitmaps, 0x0537be77 encryption header, 0x44415441 external data file).
const QCOW2SpecExtension uint32 = 0x6373696d

// qcow2 header fields the extension area depends on.
const (
	qcow2V2HeaderLength = 72  // version 2 headers are fixed-size; extensions follow them
	qcow2V3HeaderLength = 104 // the smallest version 3 header; header_length says the real size
	qcow2MinClusterBits = 9   // QEMU's limits on cluster_bits
	qcow2MaxClusterBits = 21
)

var qcow2Magic = []byte("QFI\xfb")

// ReadQCOW2Spec returns the content of a qcow2 image's QCOW2SpecExtension header extension, or
// nil when the image has none. Header extensions live in the first cluster after the header (up
// to the backing file name when there is one), each a big-endian type and length followed by
// the data padded to 8 bytes, until a type 0.
func ReadQCOW2Spec(r io.ReaderAt) ([]byte, error) {
	hdr := make([]byte, qcow2V3HeaderLength)
	n, err := r.ReadAt(hdr, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read qcow2 header: %w", err)
	}
	if n < qcow2V2HeaderLength || !bytes.Equal(hdr[:4], qcow2Magic) {
		return nil, errors.New("not a qcow2 image")
	}
	be := binary.BigEndian
	var start uint64
	switch version := be.Uint32(hdr[4:]); {
	case version == 2:
		start = qcow2V2HeaderLength
	case version == 3 && n == qcow2V3HeaderLength:
		start = uint64(be.Uint32(hdr[100:]))
	default:
		return nil, fmt.Errorf("unsupported qcow2 version %d", version)
	}
	clusterBits := be.Uint32(hdr[20:])
	if clusterBits < qcow2MinClusterBits || clusterBits > qcow2MaxClusterBits {
		return nil, fmt.Errorf("invalid qcow2 cluster_bits %d", clusterBits)
	}
	end := uint64(1) << clusterBits
	if backing := be.Uint64(hdr[8:]); backing != 0 && backing < end {
		end = backing
	}
	if start >= end {
		return nil, nil
	}
	area := make([]byte, end-start)
	n, err = r.ReadAt(area, int64(start)) //nolint:gosec // start < 2 MiB
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read qcow2 header extensions: %w", err)
	}
	return findQCOW2Extension(area[:n], QCOW2SpecExtension)
}

// findQCOW2Extension walks a header extension area for the extension of type want.
func findQCOW2Extension(area []byte, want uint32) ([]byte, error) {
	be := binary.BigEndian
	for len(area) >= 8 {
		typ, length := be.Uint32(area), uint64(be.Uint32(area[4:]))
		if typ == 0 {
			return nil, nil
		}
		area = area[8:]
		if length > uint64(len(area)) {
			return nil, fmt.Errorf("qcow2 header extension %#x is larger than the header cluster", typ)
		}
		if typ == want {
			return bytes.Clone(area[:length]), nil
		}
		area = area[min((length+7)&^7, uint64(len(area))):]
	}
	return nil, nil
}

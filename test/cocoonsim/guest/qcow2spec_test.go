package guest

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

type qcow2Ext struct {
	typ  uint32
	data string
}

// qcow2Head is the first 64 KiB cluster of a qcow2 image of the given version whose header
// extension area (after a headerLength-byte header) holds exts.
func qcow2Head(version, headerLength uint32, backingOffset uint64, exts ...qcow2Ext) []byte {
	head := make([]byte, 1<<16)
	be := binary.BigEndian
	copy(head, qcow2Magic)
	be.PutUint32(head[4:], version)
	be.PutUint64(head[8:], backingOffset)
	be.PutUint32(head[20:], 16)
	if version == 3 {
		be.PutUint32(head[100:], headerLength)
	}
	off := headerLength
	for _, ext := range exts {
		be.PutUint32(head[off:], ext.typ)
		be.PutUint32(head[off+4:], uint32(len(ext.data)))
		copy(head[off+8:], ext.data)
		off += 8 + (uint32(len(ext.data))+7)&^7
	}
	return head
}

func TestReadQCOW2Spec(t *testing.T) {
	features, spec := qcow2Ext{0x6803f857, "feature names"}, qcow2Ext{QCOW2SpecExtension, `{"fail_boot":true}`}
	tooLong := qcow2Head(3, 104, 0, spec)
	binary.BigEndian.PutUint32(tooLong[108:], 1<<16)
	for _, tc := range []struct {
		name, want, err string
		image           []byte
	}{
		{name: "after another extension", want: spec.data, image: qcow2Head(3, 112, 0, features, spec)},
		{name: "version 2", want: spec.data, image: qcow2Head(2, 72, 0, spec)},
		{name: "after the end marker", image: qcow2Head(3, 104, 0, qcow2Ext{}, spec)},
		{name: "beyond the backing file name", image: qcow2Head(3, 104, 128, features, spec)},
		{name: "none", image: qcow2Head(3, 104, 0)},
		{name: "too long", image: tooLong, err: "larger than the header cluster"},
		{name: "version 4", image: qcow2Head(4, 104, 0), err: "unsupported qcow2 version 4"},
		{name: "not qcow2", image: bytes.Repeat([]byte{1}, 512), err: "not a qcow2 image"},
	} {
		got, err := ReadQCOW2Spec(bytes.NewReader(tc.image))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.err)
		case tc.err == "" && (err != nil || string(got) != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// peekSize is enough of the stream to see a qcow2 header or, through gzip, the first tar header.
const peekSize = 64 << 10

var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// snapshotManifest is the first entry of every cocoon snapshot archive.
const snapshotManifest = "snapshot.json"

// detectKind tells a cocoon snapshot archive from a qcow2 cloud image by their first bytes,
// gzip-wrapped or not, without consuming the stream.
func detectKind(br *bufio.Reader) (store.ImageKind, error) {
	head, err := br.Peek(peekSize)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return "", fmt.Errorf("read artifact: %w", err)
	}
	if len(head) == 0 {
		return "", fmt.Errorf("the artifact is empty: %w", ErrInvalid)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(head)); err == nil {
		// A truncated decompression is fine: only the first header matters.
		unzipped, _ := io.ReadAll(io.LimitReader(zr, peekSize))
		head = unzipped
	}
	if bytes.HasPrefix(head, qcow2Magic) {
		return store.ImageCloud, nil
	}
	hdr, err := tar.NewReader(bytes.NewReader(head)).Next()
	if err != nil {
		return "", fmt.Errorf("not a cocoon snapshot archive (tar) or a qcow2 image: %w", ErrInvalid)
	}
	if hdr.Name != snapshotManifest {
		return "", fmt.Errorf("a tar whose first entry is %q, not %s, is not a cocoon snapshot archive; "+
			"OCI VM images come from a registry (crictl pull): %w", hdr.Name, snapshotManifest, ErrInvalid)
	}
	return store.ImageSnapshot, nil
}

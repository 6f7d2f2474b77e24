package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// blobOpener opens a blob of an artifact's repository: a registrySession, or a test's stand-in.
type blobOpener interface {
	open(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error)
}

// copyBufferSize is the chunk blobs move in: big enough that a pipe hand-off per chunk costs
// little next to the bytes.
const copyBufferSize = 1 << 20

// copyBlob downloads one blob into dst, checking on the way that it has exactly the size and the
// sha256 digest its descriptor gives, and telling counter how many bytes arrived. Bytes reach dst
// before the check is complete (a blob is never held whole), so on failure dst holds an unchecked
// part that the caller must discard.
func copyBlob(ctx context.Context, dst io.Writer, blobs blobOpener, desc v1.Descriptor, counter io.Writer) error {
	if desc.Digest.Algorithm != "sha256" {
		return fmt.Errorf("blob %s: only sha256 digests are supported: %w", desc.Digest, ErrInvalid)
	}
	body, err := blobs.open(ctx, desc)
	if err != nil {
		return err
	}
	defer body.Close() //nolint:errcheck
	src := io.TeeReader(body, counter)
	hash := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(dst, hash), io.LimitReader(src, desc.Size), make([]byte, copyBufferSize))
	if err != nil {
		return fmt.Errorf("download blob %s: %w", desc.Digest, err)
	}
	if n < desc.Size {
		return fmt.Errorf("blob %s ended after %d of its %d bytes: %w", desc.Digest, n, desc.Size, ErrCorrupt)
	}
	if extra, _ := src.Read(make([]byte, 1)); extra > 0 {
		return fmt.Errorf("blob %s is longer than its %d bytes: %w", desc.Digest, desc.Size, ErrCorrupt)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != desc.Digest.Hex {
		return fmt.Errorf("blob %s has the digest sha256:%s: %w", desc.Digest, got, ErrCorrupt)
	}
	return nil
}

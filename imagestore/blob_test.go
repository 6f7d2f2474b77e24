package imagestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// blobsInMemory serves blobs by digest.
type blobsInMemory map[string][]byte

func (b blobsInMemory) open(_ context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	data, ok := b[desc.Digest.String()]
	if !ok {
		return nil, ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

func descriptorOf(data []byte) v1.Descriptor {
	sum := sha256.Sum256(data)
	return v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, Size: int64(len(data))}
}

func TestCopyBlobChecksSizeAndDigest(t *testing.T) {
	content := []byte("the bytes the manifest describes")
	good := descriptorOf(content)
	cases := []struct {
		name   string
		served []byte
		desc   v1.Descriptor
		want   error
	}{
		{"intact", content, good, nil},
		{"another content of the same size", bytes.ToUpper(content), good, ErrCorrupt},
		{"shorter", content[:10], good, ErrCorrupt},
		{"longer", append(bytes.Clone(content), '!'), good, ErrCorrupt},
		{"not sha256", content, v1.Descriptor{Digest: v1.Hash{Algorithm: "sha512", Hex: "00"}, Size: good.Size}, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, counted bytes.Buffer
			err := copyBlob(context.Background(), &out, blobsInMemory{tc.desc.Digest.String(): tc.served}, tc.desc, &counted)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("copyBlob: %v, want %v", err, tc.want)
			}
			if tc.want == nil && (!bytes.Equal(out.Bytes(), content) || counted.Len() != len(content)) {
				t.Fatalf("copied %q, counted %d bytes", out.Bytes(), counted.Len())
			}
		})
	}
}

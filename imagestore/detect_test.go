package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

func tarWith(t *testing.T, names ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		body := []byte(`{"version":1}`)
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDetectKind(t *testing.T) {
	qcow2 := append([]byte{'Q', 'F', 'I', 0xfb, 0, 0, 0, 3}, make([]byte, 1000)...)
	snapshot := tarWith(t, "snapshot.json", "config.json", "cow.raw")
	cases := []struct {
		name string
		data []byte
		kind store.ImageKind
	}{
		{"qcow2", qcow2, store.ImageCloud},
		{"gzip qcow2", gzipped(t, qcow2), store.ImageCloud},
		{"snapshot archive", snapshot, store.ImageSnapshot},
		{"gzip snapshot archive", gzipped(t, snapshot), store.ImageSnapshot},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(bytes.NewReader(tc.data), peekSize)
			kind, err := detectKind(br)
			if err != nil || kind != tc.kind {
				t.Fatalf("kind %q, err %v; want %q", kind, err, tc.kind)
			}
			// Detection must not consume the stream.
			rest, _ := io.ReadAll(br)
			if !bytes.Equal(rest, tc.data) {
				t.Fatal("detection consumed bytes")
			}
		})
	}
}

func TestDetectKindRefusesOtherContent(t *testing.T) {
	for name, data := range map[string][]byte{
		"empty":           nil,
		"garbage":         []byte("this is not an image"),
		"OCI layer tar":   tarWith(t, "bin/sh"),
		"gzip of garbage": gzipped(t, []byte("nope")),
	} {
		_, err := detectKind(bufio.NewReaderSize(bytes.NewReader(data), peekSize))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/test/registry"
)

// TestSnapshotArchiveIsRebuiltByteForByte: a snapshot pushed in epoch's format comes back as the
// very archive cocoon exported: snapshot.json first, the files in order, modes and sparse records
// restored. (The entries' time is the artifact's creation time, here the archive's own.)
func TestSnapshotArchiveIsRebuiltByteForByte(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	ctx := context.Background()
	for name, opts := range snapshotLayouts {
		t.Run(name, func(t *testing.T) {
			original := snapshotArchive(t, opts)
			hdr, err := tar.NewReader(bytes.NewReader(original)).Next()
			if err != nil {
				t.Fatal(err)
			}
			repoTag := fmt.Sprintf("rebuild/%d:v1", len(original))
			if _, err := reg.direct.PushSnapshot(ctx, repoTag, bytes.NewReader(original), registry.SnapshotPush{CreatedAt: hdr.ModTime}); err != nil {
				t.Fatal(err)
			}
			session, art := reg.resolve(t, repoTag)
			cfg, err := fetchSnapshotConfig(ctx, session, art.manifest.Config, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var rebuilt bytes.Buffer
			if err := writeSnapshotArchive(ctx, &rebuilt, opts.Name, cfg, art.manifest.Layers, session, io.Discard); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rebuilt.Bytes(), original) {
				t.Fatalf("the rebuilt archive differs:\noriginal %s\nrebuilt  %s", describeTar(t, original), describeTar(t, rebuilt.Bytes()))
			}
		})
	}
}

// describeTar lists a tar's headers, for failure messages.
func describeTar(t *testing.T, data []byte) string {
	t.Helper()
	var out string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			return out + " " + err.Error()
		}
		out += fmt.Sprintf("\n  %s size=%d mode=%o time=%d pax=%v", hdr.Name, hdr.Size, hdr.Mode, hdr.ModTime.Unix(), hdr.PAXRecords)
	}
}

func TestSnapshotLayerTitlesMustBeFileNames(t *testing.T) {
	for _, bad := range []string{"", "../escape", "dir/file", ".", "..", "snapshot.json"} {
		if plainFileName(bad) {
			t.Errorf("title %q accepted", bad)
		}
	}
	for _, good := range []string{"config.json", "memory-range-0", "cow.raw", "cocoon-sim-guest.json"} {
		if !plainFileName(good) {
			t.Errorf("title %q refused", good)
		}
	}
}

// A registry's file modes reach cocoon's extractor as permission bits only: no setuid, setgid or
// sticky bit, whatever the snapshot's config says.
func TestSnapshotFileModesAreMasked(t *testing.T) {
	layer := v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("a", 64)}, Size: 3,
		Annotations: map[string]string{"org.opencontainers.image.title": "cow.raw"}}
	for mode, want := range map[int64]int64{0o4755: 0o755, 0o2640: 0o640, 0o1777: 0o777, 0o7000: 0o640, 0: 0o640, 0o600: 0o600} {
		hdr, err := snapshotEntryHeader(layer, snapshotFile{Mode: mode}, time.Time{})
		if err != nil || hdr.Mode != want {
			t.Errorf("mode %o: header mode %o, %v; want %o", mode, hdr.Mode, err, want)
		}
	}
}

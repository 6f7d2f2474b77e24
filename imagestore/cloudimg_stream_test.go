package imagestore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestCloudImageDiskIsConcatenatedInTitleOrder: the parts are listed in reverse, with a checksum
// layer among them; the disk comes back whole and in order.
func TestCloudImageDiskIsConcatenatedInTitleOrder(t *testing.T) {
	reg := newTestRegistry(t, "", "")
	disk := qcow2Disk(t)
	if _, err := reg.direct.PushCloudImage(context.Background(), "cloud/disk:v1", disk, 3); err != nil {
		t.Fatal(err)
	}
	session, art := reg.resolve(t, "cloud/disk:v1")
	if art.kind != "cloudimg" {
		t.Fatalf("classified as %s", art.kind)
	}
	disks, err := diskLayers(art.manifest)
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 3 || len(art.manifest.Layers) != 4 {
		t.Fatalf("%d disk layers of %d", len(disks), len(art.manifest.Layers))
	}
	var out bytes.Buffer
	if err := writeDiskImage(context.Background(), &out, disks, session, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), disk) {
		t.Fatalf("the disk came back different: %d bytes of %d", out.Len(), len(disk))
	}
}

func TestCloudImageWithoutDiskIsRefused(t *testing.T) {
	m := &v1.Manifest{Layers: []v1.Descriptor{{MediaType: "text/plain", Annotations: map[string]string{annotationTitle: "SHA256SUMS"}}}}
	if _, err := diskLayers(m); !errors.Is(err, ErrInvalid) {
		t.Fatalf("diskLayers: %v", err)
	}
}

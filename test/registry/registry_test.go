package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

func requireServer(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
}

// TestSnapshotIsPushedInEpochsFormat: the Debian registry takes the push, and the manifest is
// epoch's: the snapshot artifactType, one titled layer per data file in archive order, typed by
// file name, and a config blob with each file's mode and sparse records.
func TestSnapshotIsPushedInEpochsFormat(t *testing.T) {
	requireServer(t)
	s := Start(t, Options{})
	var archive bytes.Buffer
	if err := testimage.WriteSnapshotArchive(&archive, testimage.SnapshotOptions{Name: "snap", NICs: 1}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pushed, err := s.Target().PushSnapshot(ctx, "epoch/snap:v1", bytes.NewReader(archive.Bytes()), SnapshotPush{})
	if err != nil {
		t.Fatalf("push: %v\n%s", err, s.Log())
	}
	ref, _ := name.ParseReference(pushed.DigestRef())
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != artifactTypeSnapshot || m.Config.MediaType != mediaTypeSnapshotConfig {
		t.Fatalf("manifest: artifactType %q, config %q", m.ArtifactType, m.Config.MediaType)
	}
	var titles []string
	types := map[string]string{}
	for _, l := range m.Layers {
		titles = append(titles, l.Annotations[titleAnnotation])
		types[l.Annotations[titleAnnotation]] = string(l.MediaType)
	}
	if want := []string{"cocoon.json", "config.json", "cow.raw", "memory-range-0", "state.json"}; !slices.Equal(titles, want) {
		t.Fatalf("layer titles %v, want %v", titles, want)
	}
	if types["config.json"] != "application/vnd.cocoonstack.vm.config+json" || types["cow.raw"] != string(mediaTypeDiskRaw) ||
		types["memory-range-0"] != "application/octet-stream" {
		t.Fatalf("layer media types %v", types)
	}
	layer, err := remote.Layer(ref.Context().Digest(m.Config.Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layer.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var cfg epochSnapshotConfig
	if err := json.NewDecoder(rc).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.SchemaVersion != "v1" || cfg.Hypervisor != cocoon.HypervisorCloudHypervisor || cfg.NICs != 1 ||
		cfg.Files["cow.raw"].SparseSize != 10<<30 || cfg.Files["cow.raw"].SparseMap == "" || cfg.Files["config.json"].Mode != 0o644 {
		t.Fatalf("config blob: %+v", cfg)
	}
}

func TestRegistryWithCredentials(t *testing.T) {
	requireServer(t)
	s := Start(t, Options{Username: "puller", Password: "s3cret"})
	pushed, err := s.Target().PushCloudImage(context.Background(), "private/disk:v1", []byte("QFI\xfb a disk"), 2)
	if err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	ref, _ := name.ParseReference(pushed.Ref)
	_, err = remote.Get(ref)
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous pull: %v", err)
	}
	if _, err := remote.Get(ref, remote.WithAuth(s.Target().Auth)); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
}

package imagestore

import (
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

func TestClassifyByArtifactType(t *testing.T) {
	cases := map[string]store.ImageKind{
		"application/vnd.cocoonstack.snapshot.v1+json":      store.ImageSnapshot,
		"application/vnd.cocoonstack.os-image.v1+json":      store.ImageCloud,
		"application/vnd.cocoonstack.windows-image.v1+json": store.ImageCloud,
		"":                                  store.ImageOCI,
		"application/vnd.example.sbom+json": store.ImageOCI,
	}
	for artifactType, want := range cases {
		if got := classify(&v1.Manifest{ArtifactType: artifactType}); got != want {
			t.Errorf("artifactType %q: %s, want %s", artifactType, got, want)
		}
	}
}

package imagestore

import (
	"errors"
	"slices"
	"testing"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"ubuntu":                        "docker.io/library/ubuntu:latest",
		"ubuntu:24.04":                  "docker.io/library/ubuntu:24.04",
		"epoch.local:8080/team/snap:v1": "epoch.local:8080/team/snap:v1",
		"localhost/demo":                "localhost/demo:latest",
		"repo@sha256:" + hex64('a'):     "docker.io/library/repo@sha256:" + hex64('a'),
		// A tag next to a digest says nothing more: the digest is what is pulled and recorded.
		"quay.io/x/y:v1@sha256:" + hex64('b'): "quay.io/x/y@sha256:" + hex64('b'),
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "Upper", "a b", "x:"} {
		if _, err := Normalize(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Normalize(%q): err = %v", bad, err)
		}
	}
	if _, err := NormalizeTag("repo@sha256:" + hex64('a')); !errors.Is(err, ErrInvalid) {
		t.Errorf("a digest reference was accepted as an import tag: %v", err)
	}
}

func TestIDForms(t *testing.T) {
	full := "sha256:" + hex64('c')
	for _, in := range []string{full, hex64('c')} {
		if id, ok := asID(in); !ok || id != full {
			t.Errorf("asID(%q) = %q, %v", in, id, ok)
		}
	}
	if _, ok := asID("sha256:abc"); ok {
		t.Error("a prefix read as a full ID")
	}
	if !isHexPrefix("cccc") || !isHexPrefix("sha256:ccc") || isHexPrefix("cc") || isHexPrefix("web") {
		t.Error("hex prefix detection")
	}
	if !hasHexPrefix(full, "ccc") || !hasHexPrefix(full, "sha256:cccc") || hasHexPrefix(full, "ccd") {
		t.Error("hex prefix match")
	}
}

func TestDropReference(t *testing.T) {
	img := &store.Image{
		RepoTags:    []string{"docker.io/library/app:1", "docker.io/library/app:2", "docker.io/library/other:1"},
		RepoDigests: []string{"docker.io/library/app@sha256:" + hex64('a'), "docker.io/library/other@sha256:" + hex64('a')},
	}
	dropReference(img, "docker.io/library/app:1")
	if !slices.Equal(img.RepoTags, []string{"docker.io/library/app:2", "docker.io/library/other:1"}) || len(img.RepoDigests) != 2 {
		t.Fatalf("after dropping app:1: %+v", img)
	}
	// The repository's last tag takes its digest reference along.
	dropReference(img, "docker.io/library/app:2")
	if !slices.Equal(img.RepoDigests, []string{"docker.io/library/other@sha256:" + hex64('a')}) {
		t.Fatalf("after dropping app:2: %+v", img)
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

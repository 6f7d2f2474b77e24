package imagestore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// pullOCIImage has cocoon pull an OCI VM image itself: it converts the layers to EROFS, which
// cocoon-cri cannot do for it. cocoon records the literal reference it pulled, so the image is
// pulled by digest (repo@sha256:...): the name then says exactly which manifest it holds, and VMs
// are created from that same string.
func (s *Service) pullOCIImage(ctx context.Context, art *artifact, creds Credentials) (*store.Image, error) {
	localName := art.ref.Context().Digest(art.id).String()
	config, remove, err := dockerConfig(s.pullOpts.CredentialsDir, art.ref.Context().Registry, creds)
	if err != nil {
		return nil, err
	}
	defer remove()
	pulled, err := s.cocoon.ImagePull(ctx, localName, cocoon.PullOptions{DockerConfig: config})
	if err != nil {
		s.discardArtifact(ctx, store.ImageOCI, localName)
		if strings.Contains(err.Error(), "mkfs.erofs") {
			return nil, fmt.Errorf("%w (cocoon converts OCI VM image layers with `mkfs.erofs --tar`, which Debian 12's "+
				"erofs-utils 1.5 lacks: use a snapshot or a cloud image on such a node, or a newer erofs-utils)", err)
		}
		return nil, err
	}
	return &store.Image{ID: art.id, Kind: store.ImageOCI, LocalName: localName, Size: pulled.Size, CreatedAt: time.Now().UnixNano()}, nil
}

// resetCredentialsDir makes the private directory of pull credentials, removing what a crash left
// in it.
func resetCredentialsDir(dir string) error {
	if dir == "" {
		return fmt.Errorf("no directory for registry credentials: set PullOptions.CredentialsDir")
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("empty the registry credentials directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make the registry credentials directory: %w", err)
	}
	// MkdirAll leaves an existing parent's mode, and the umask may have widened this one.
	return os.Chmod(dir, 0o700)
}

// dockerConfig writes the pull's credentials where cocoon's docker keychain reads them: a
// directory of its own in under (the private credentials directory) holding config.json, which
// remove deletes. An anonymous pull gets none.
func dockerConfig(under string, registry name.Registry, creds Credentials) (dir string, remove func(), err error) {
	if creds == (Credentials{}) {
		return "", func() {}, nil
	}
	auth := creds.Auth
	if auth == "" && creds.Username+creds.Password != "" {
		auth = base64.StdEncoding.EncodeToString([]byte(creds.Username + ":" + creds.Password))
	}
	// The keychain looks Docker Hub up under its legacy key.
	key := registry.RegistryStr()
	if key == name.DefaultRegistry {
		key = authn.DefaultAuthKey
	}
	data, err := json.Marshal(map[string]any{"auths": map[string]any{key: map[string]string{
		"auth": auth, "identitytoken": creds.IdentityToken, "registrytoken": creds.RegistryToken,
	}}})
	if err != nil {
		return "", nil, err
	}
	dir, err = os.MkdirTemp(under, "pull-")
	if err != nil {
		return "", nil, fmt.Errorf("credentials for cocoon: %w", err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		remove()
		return "", nil, fmt.Errorf("credentials for cocoon: %w", err)
	}
	return dir, remove, nil
}

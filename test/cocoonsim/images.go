package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// minDigestPrefix is the shortest hex prefix that finds an image by digest.
const minDigestPrefix = 12

var errImageAmbiguous = errors.New("image ref resolves to multiple backends")

// imageDirs is one image backend's directory layout: <root>/<sub>/{db,temp,blobs}.
type imageDirs struct {
	base    string
	blobExt string
}

func (d imageDirs) dbDir() string              { return filepath.Join(d.base, "db") }
func (d imageDirs) tempDir() string            { return filepath.Join(d.base, "temp") }
func (d imageDirs) blobsDir() string           { return filepath.Join(d.base, "blobs") }
func (d imageDirs) blobPath(hex string) string { return filepath.Join(d.blobsDir(), hex+d.blobExt) }
func (d imageDirs) ensure() error              { return ensureDirs(d.dbDir(), d.tempDir(), d.blobsDir()) }

func indexDB[T any](d imageDirs) jsonDB[T] {
	return jsonDB[T]{path: filepath.Join(d.dbDir(), "images.json"), lockPath: filepath.Join(d.dbDir(), "images.lock")}
}

// digestHex strips the algorithm from "sha256:<hex>".
func digestHex(d string) string { return strings.TrimPrefix(d, "sha256:") }

// imageEntry is what both backends' index entries share for lookup and printing.
type imageEntry interface {
	id() string
	ref() string
	created() time.Time
	size() int64
}

// lookupRefs returns the index keys that match query: the exact key, or every entry whose digest
// equals it or starts with it (at least 12 hex digits), as cocoon's images.LookupRefs.
func lookupRefs[E imageEntry](entries map[string]E, query string) []string {
	if _, ok := entries[query]; ok {
		return []string{query}
	}
	queryHex := digestHex(query)
	var refs []string
	for key, e := range entries {
		idHex := digestHex(e.id())
		if e.id() == query || idHex == query || (len(queryHex) >= minDigestPrefix && strings.HasPrefix(idHex, queryHex)) {
			refs = append(refs, key)
		}
	}
	return refs
}

func toImage(e imageEntry, typ string) *cocoon.Image {
	return &cocoon.Image{ID: e.id(), Name: e.ref(), Type: typ, Size: e.size(), CreatedAt: e.created()}
}

// imageBackend is what image inspect, list and rm need from either backend.
type imageBackend interface {
	typ() string
	inspect(ctx context.Context, ref string) (*cocoon.Image, error)
	list(ctx context.Context) ([]*cocoon.Image, error)
	delete(ctx context.Context, refs []string) ([]string, error)
}

// imageOps implements imageBackend over an index of entries.
type imageOps[I any, E imageEntry] struct {
	backendType string
	db          jsonDB[I]
	entries     func(*I) map[string]E
}

func (o imageOps[I, E]) typ() string { return o.backendType }

func (o imageOps[I, E]) inspect(ctx context.Context, ref string) (*cocoon.Image, error) {
	var img *cocoon.Image
	return img, o.db.With(ctx, func(idx *I) error {
		if refs := lookupRefs(o.entries(idx), ref); len(refs) > 0 {
			img = toImage(o.entries(idx)[refs[0]], o.backendType)
		}
		return nil
	})
}

func (o imageOps[I, E]) list(ctx context.Context) ([]*cocoon.Image, error) {
	var imgs []*cocoon.Image
	return imgs, o.db.With(ctx, func(idx *I) error {
		for _, e := range o.entries(idx) {
			imgs = append(imgs, toImage(e, o.backendType))
		}
		return nil
	})
}

func (o imageOps[I, E]) delete(ctx context.Context, refs []string) ([]string, error) {
	var deleted []string
	return deleted, o.db.Update(ctx, func(idx *I) error {
		entries := o.entries(idx)
		for _, ref := range refs {
			for _, key := range lookupRefs(entries, ref) {
				delete(entries, key)
				deleted = append(deleted, key)
			}
		}
		return nil
	})
}

// imageBackends opens both image backends (creating their directories), OCI first.
func (a *app) imageBackends() (*ociStore, *cloudimgStore, error) {
	oci, err := newOCIStore(a.conf.RootDir)
	if err != nil {
		return nil, nil, fmt.Errorf("init oci backend: %w", err)
	}
	cloudimg, err := newCloudimgStore(a.conf.RootDir)
	if err != nil {
		return nil, nil, fmt.Errorf("init cloudimg backend: %w", err)
	}
	return oci, cloudimg, nil
}

// resolveImageOwner finds the single backend holding ref.
func resolveImageOwner(ctx context.Context, backends []imageBackend, ref string) (imageBackend, error) {
	var matches []imageBackend
	for _, b := range backends {
		img, err := b.inspect(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("inspect %s in %s: %w", ref, b.typ(), err)
		}
		if img != nil {
			matches = append(matches, b)
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("image %q: not found in any backend", ref)
	case 1:
		return matches[0], nil
	default:
		names := make([]string, len(matches))
		for i, b := range matches {
			names[i] = b.typ()
		}
		return nil, fmt.Errorf("image %s: %w (backends: %s)", ref, errImageAmbiguous, strings.Join(names, ", "))
	}
}

package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Pull resolves ref in its registry and brings the artifact into cocoon: a snapshot (streamed into
// `cocoon snapshot import`), a cloud image (its disk into `cocoon image import`) or an OCI VM image
// (`cocoon image pull`). The image is recorded under ref and the repository digest ref resolved
// to; its ID is the digest of the manifest for this node's platform, so a digest already present
// is only tagged. Concurrent pulls of one reference with the same credentials share one download.
func (s *Service) Pull(ctx context.Context, ref string, creds Credentials) (*store.Image, error) {
	normalized, err := Normalize(ref)
	if err != nil {
		return nil, err
	}
	remoteRef, err := s.registry.parse(normalized)
	if err != nil {
		return nil, err
	}
	return s.pulls.do(ctx, pullKey(normalized, creds), func(ctx context.Context) (*store.Image, error) {
		return s.pull(ctx, normalized, remoteRef, creds)
	})
}

// pullKey is what concurrent pulls share a download by: the reference and the credentials (one
// caller's credentials must not pull for another), the latter hashed rather than kept.
func pullKey(normalized string, c Credentials) string {
	sum := sha256.Sum256([]byte(c.Username + "\x00" + c.Password + "\x00" + c.Auth + "\x00" + c.IdentityToken + "\x00" + c.RegistryToken))
	return normalized + "\x00" + hex.EncodeToString(sum[:])
}

func (s *Service) pull(ctx context.Context, ref string, remoteRef name.Reference, creds Credentials) (*store.Image, error) {
	start := time.Now()
	progress := s.newPullProgress(ref)
	img, err := s.pullArtifact(ctx, ref, remoteRef, creds, progress)
	if err != nil {
		if stall := progress.stallError(); stall != nil {
			err = stall
		}
		s.pulled(progress, time.Since(start), err)
		s.log.Warn("image pull failed", "ref", ref, "err", err)
		return nil, err
	}
	took := time.Since(start)
	s.pulled(progress, took, nil)
	progress.report(time.Now(), true)
	s.log.Info("image pulled", "ref", ref, "image", img.ID, "kind", img.Kind, "artifact", img.LocalName,
		"bytes", progress.bytes.Load(), "took", took)
	// A tag that moved may have left another image with no reference: delete it unless needed.
	if err := s.Sweep(ctx); err != nil {
		s.log.Warn("deleting unused artifacts failed; the next removal retries", "err", err)
	}
	return img, nil
}

func (s *Service) pullArtifact(ctx context.Context, ref string, remoteRef name.Reference, creds Credentials, progress *pullProgress) (*store.Image, error) {
	watchCtx, stopWatch := progress.watch(ctx)
	session, err := s.registry.connect(watchCtx, remoteRef.Context(), creds)
	var art *artifact
	if err == nil {
		art, err = session.resolve(watchCtx, remoteRef)
	}
	stopWatch()
	if err != nil {
		return nil, err
	}
	refs := []string{ref}
	if digestRef := repository(ref) + "@" + art.resolved.String(); digestRef != ref {
		refs = append(refs, digestRef)
	}

	progress.kind = art.kind

	unlock := s.digestLocks.Lock(art.id)
	defer unlock()
	// The artifact of a known digest is in cocoon already (maybe of a removed image): tag it.
	if img, err := s.store.Images.Get(art.id); err == nil {
		progress.present = true
		return s.commit(img, refs...)
	}
	var img *store.Image
	switch art.kind {
	case store.ImageSnapshot:
		if img, err = s.pullSnapshot(ctx, session, art, progress); err == nil {
			err = s.withBase(ctx, img, art.ref.Context().Registry, creds)
		}
	case store.ImageCloud:
		img, err = s.pullCloudImage(ctx, session, art, progress)
	default:
		img, err = s.pullOCIImage(ctx, art, creds)
	}
	if err != nil {
		return nil, fmt.Errorf("pull %s (%s %s): %w", ref, art.kind, art.id, err)
	}
	return s.commit(img, refs...)
}

// pulled tells the OnPulled hook how a pull ended.
func (s *Service) pulled(progress *pullProgress, took time.Duration, err error) {
	if s.pullOpts.OnPulled == nil {
		return
	}
	s.pullOpts.OnPulled(PullResult{Ref: progress.ref, Kind: progress.kind, Present: progress.present,
		Bytes: progress.bytes.Load(), Took: took, Err: err})
}

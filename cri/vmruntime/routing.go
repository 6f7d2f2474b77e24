package vmruntime

import (
	"context"
	"errors"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/cgroups"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// What the CRI edge (package cri) asks to route requests. Every answer comes from the records in
// memory: the edge asks on every request, the kubelet's relists included.

// HandlerName is the RuntimeClass handler of VM pods.
func (s *Runtime) HandlerName() string { return HandlerName }

// ServesHandler reports whether RunPodSandbox with handler makes a VM pod.
func (s *Runtime) ServesHandler(handler string) bool {
	return handler == HandlerName || (handler == "" && s.cfg.ServeDefaultHandler)
}

// OwnsSandbox reports whether idOrPrefix names a sandbox of this runtime; a prefix that names
// several is still this runtime's to refuse.
func (s *Runtime) OwnsSandbox(idOrPrefix string) bool {
	_, err := s.store.Sandboxes.Resolve(idOrPrefix)
	return err == nil || errors.Is(err, store.ErrAmbiguous)
}

// OwnsContainer is OwnsSandbox for containers.
func (s *Runtime) OwnsContainer(idOrPrefix string) bool {
	_, err := s.store.Containers.Resolve(idOrPrefix)
	return err == nil || errors.Is(err, store.ErrAmbiguous)
}

// HoldsVMArtifact reports whether ref names a snapshot or cloud image held here.
func (s *Runtime) HoldsVMArtifact(ref string) bool {
	img, err := s.images.Get(ref)
	return err == nil && img.Kind != store.ImageOCI
}

// IsVMArtifact resolves ref in its registry and reports whether it is a snapshot or a cloud image.
func (s *Runtime) IsVMArtifact(ctx context.Context, ref string, auth *runtimeapi.AuthConfig) (bool, error) {
	kind, err := s.images.Classify(ctx, ref, pullCredentials(auth))
	if err != nil {
		return false, err
	}
	return kind != store.ImageOCI, nil
}

// NotePull keeps the credentials another runtime pulled ref with, for a VM pod that then needs
// ref brought into cocoon (containerImage).
func (s *Runtime) NotePull(ref string, auth *runtimeapi.AuthConfig) {
	s.pullAuths.note(ref, pullCredentials(auth), s.nowFunc())
}

// CgroupDriver is the driver VMs are placed into pod cgroups with.
func (s *Runtime) CgroupDriver() runtimeapi.CgroupDriver {
	if s.cgroups.Name() == cgroups.Systemd {
		return runtimeapi.CgroupDriver_SYSTEMD
	}
	return runtimeapi.CgroupDriver_CGROUPFS
}

// pullAuthTTL is how long the credentials of another runtime's pull are kept: the kubelet creates
// the container right after pulling its image, and credentials are not kept longer than needed.
const pullAuthTTL = 30 * time.Minute

// pullAuths holds registry credentials in memory only, never on disk, by reference.
type pullAuths struct {
	mu    sync.Mutex
	byRef map[string]noted
}

type noted struct {
	creds imagestore.Credentials
	at    time.Time
}

func (p *pullAuths) note(ref string, creds imagestore.Credentials, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byRef == nil {
		p.byRef = map[string]noted{}
	}
	for r, n := range p.byRef {
		if now.Sub(n.at) > pullAuthTTL {
			delete(p.byRef, r)
		}
	}
	p.byRef[ref] = noted{creds: creds, at: now}
}

func (p *pullAuths) get(ref string, now time.Time) imagestore.Credentials {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.byRef[ref]; ok && now.Sub(n.at) <= pullAuthTTL {
		return n.creds
	}
	return imagestore.Credentials{}
}

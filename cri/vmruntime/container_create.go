package vmruntime

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// CreateContainer resolves the image, decides the VM (mode and size) and records the container as
// CREATED. No cocoon call happens: the VM is made by StartContainer.
func (s *Runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	if err := validateContainerConfig(cfg); err != nil {
		return nil, err
	}
	if err := s.checkCommandCanRun(ctx, cfg); err != nil {
		return nil, err
	}
	// Before the sandbox lock: bringing the image into cocoon may take long.
	img, err := s.containerImage(ctx, cfg.GetImage())
	if err != nil {
		return nil, err
	}
	sb, unlock, err := s.lockSandbox(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != store.SandboxReady {
		return nil, precondition("pod sandbox %s is not ready (stopped); create the container in a running sandbox", sb.ID)
	}
	name := containerName(cfg.GetMetadata(), sb.Name)
	if holder, ok := s.store.Containers.Lookup(store.ContainerNameKey(name)); ok {
		return nil, alreadyExists("container name %q is already reserved for container %s", name, holder.ID)
	}

	cloneResizes := false
	if img.Kind == store.ImageSnapshot {
		caps, err := s.cocoon.Capabilities(ctx)
		if err != nil {
			return nil, fmt.Errorf("learn what this cocoon's vm clone can do: %w", err)
		}
		cloneResizes = caps.CloneResize
	}
	id := newID()
	vm, err := s.planVM(id, cfg, sb, img, cloneResizes)
	if err == nil && sb.VM.ForkFrom != "" {
		vm, err = s.forkVM(sb, img, vm)
	}
	if err != nil {
		return nil, err
	}
	if err := s.checkDevicesCanAttach(ctx, cfg.GetDevices(), vm.Backend); err != nil {
		return nil, err
	}
	if err := s.volumes.checkCanReach(ctx, cfg, vm); err != nil {
		return nil, err
	}
	c := &store.Container{
		ID:        id,
		SandboxID: sb.ID,
		Name:      name,
		Config:    store.Proto[*runtimeapi.ContainerConfig]{Msg: cfg},
		ImageRef:  cfg.GetImage().GetImage(),
		ImageID:   img.ID,
		State:     store.ContainerCreated,
		LogPath:   logPath(sb.Config.Msg.GetLogDirectory(), cfg.GetLogPath()),
		CreatedAt: s.now(),
		VM:        vm,
	}
	if err := s.store.Containers.Create(c); err != nil {
		return nil, fmt.Errorf("record container: %w", err)
	}
	s.emit(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, c)
	s.log.Info("container created", "container", id, "sandbox", sb.ID, "image", img.ID,
		"vm", vm.Name, "mode", vm.Mode, "cpu", vm.CPU, "memory", vm.Memory, "storage", vm.Storage)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// containerImage finds the container's image in cocoon, by the reference or ID the kubelet names or
// by the reference the user wrote: the kubelet names the image by the ID its ImageStatus gave,
// the passthrough runtime's for an OCI image. With passthrough, an OCI VM image cocoon lacks is
// brought in here.
func (s *Runtime) containerImage(ctx context.Context, spec *runtimeapi.ImageSpec) (*store.Image, error) {
	ref, userRef := spec.GetImage(), spec.GetUserSpecifiedImage()
	img, err := s.images.Get(ref)
	if errors.Is(err, imagestore.ErrNotFound) && userRef != "" && userRef != ref {
		img, err = s.images.Get(userRef)
	}
	if !errors.Is(err, imagestore.ErrNotFound) {
		return img, err
	}
	if !s.cfg.PullOnCreate {
		return nil, notFound("image %q is not present on this node: pull it, or import it with cocoon-cri image import --ref %s FILE", ref, ref)
	}
	return s.bringIn(ctx, cmp.Or(userRef, ref))
}

// bringIn pulls ref into cocoon for a VM pod. The pull goes on when the kubelet's CreateContainer
// deadline passes, bounded by the pull's own progress timeout, and the kubelet's retry joins it:
// a VM image may take longer to pull than one CreateContainer may last.
func (s *Runtime) bringIn(ctx context.Context, ref string) (*store.Image, error) {
	type pulled struct {
		img *store.Image
		err error
	}
	done := make(chan pulled, 1)
	go func() {
		img, err := s.images.Pull(context.WithoutCancel(ctx), ref, s.pullAuths.get(ref, s.nowFunc()))
		done <- pulled{img, err}
	}()
	select {
	case p := <-done:
		if p.err != nil {
			return nil, fmt.Errorf("image %s is not in cocoon and bringing it in from its registry failed "+
				"(a VM pod needs a cocoon snapshot, a cloud image or an OCI VM image): %w", ref, p.err)
		}
		s.log.Info("image brought into cocoon for a VM pod", "ref", ref, "image", p.img.ID, "kind", p.img.Kind)
		return p.img, nil
	case <-ctx.Done():
		return nil, timedOut(
			"image %s is still being brought into cocoon; the pull goes on, and the next CreateContainer finds it", ref)
	}
}

// checkCommandCanRun refuses a container with a command where commands cannot reach guests.
func (s *Runtime) checkCommandCanRun(ctx context.Context, cfg *runtimeapi.ContainerConfig) error {
	if len(mainCommand(cfg)) == 0 {
		return nil
	}
	path, err := s.guest.path(ctx)
	if err != nil {
		return err
	}
	if path == ExecPathNone {
		return invalid("the container has a command, which runs in the guest through cocoon's vm exec or SSH, and neither is available: " +
			"this cocoon has no vm exec and no guest SSH login is configured (--guest-ssh-key-file); " +
			"upgrade cocoon, configure SSH, or leave command and args empty to let the VM's init be the workload")
	}
	return nil
}

func validateContainerConfig(cfg *runtimeapi.ContainerConfig) error {
	if cfg == nil {
		return invalid("config is required")
	}
	if cfg.GetMetadata().GetName() == "" {
		return invalid("metadata.name is required")
	}
	if cfg.GetImage().GetImage() == "" {
		return invalid("image is required")
	}
	// The environment and working directory travel to the guest as command-line arguments, which
	// cannot hold a NUL byte.
	for _, kv := range cfg.GetEnvs() {
		if kv.GetKey() == "" || strings.ContainsAny(kv.GetKey(), "=\x00") {
			return invalid("envs: %q is not an environment variable name (non-empty, without '=' or NUL)", kv.GetKey())
		}
		if bytes.IndexByte(kv.GetValue(), 0) >= 0 {
			return invalid("envs: the value of %s holds a NUL byte, which no process environment can", kv.GetKey())
		}
	}
	// The console log is written there: it must stay inside the pod's log directory.
	if p := cfg.GetLogPath(); p != "" && (!filepath.IsLocal(p) || strings.IndexByte(p, 0) >= 0) {
		return invalid("log_path %q must be a relative path inside the pod's log directory (the kubelet's is <container>/<restart>.log)", p)
	}
	if dir := cfg.GetWorkingDir(); dir != "" && (!path.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0) {
		return invalid("working_dir %q must be an absolute path in the guest", dir)
	}
	if err := validateMounts(cfg.GetMounts()); err != nil {
		return err
	}
	if adj := cfg.GetLinux().GetResources().GetOomScoreAdj(); adj < minOOMScoreAdj || adj > maxOOMScoreAdj {
		return invalid("linux.resources.oom_score_adj %d is outside [%d, %d]", adj, minOOMScoreAdj, maxOOMScoreAdj)
	}
	if err := validateDevices(cfg.GetDevices()); err != nil {
		return err
	}
	if cdi := cfg.GetCDIDevices(); len(cdi) > 0 {
		return invalid("CDI device %s cannot be given to a VM: cocoon-cri does not read CDI specs; give the container the device's "+
			"VFIO group (/dev/vfio/<group>, as VFIO device plugins do) or its block device, or run it with another runtime class", cdi[0].GetName())
	}
	return nil
}

// logPath is where the kubelet expects the container's log, or empty when it asked for none.
func logPath(dir, rel string) string {
	if dir == "" || rel == "" {
		return ""
	}
	return filepath.Join(dir, rel)
}

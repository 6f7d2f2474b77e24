package cri

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/imagestore"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// CreateContainer resolves the image, decides the VM (mode and size) and records the container as
// CREATED. No cocoon call happens: the VM is made by StartContainer.
func (s *Server) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	if err := validateContainerConfig(cfg); err != nil {
		return nil, err
	}
	if len(mainCommand(cfg)) > 0 && !s.hasExecPath(ctx) {
		return nil, invalid("the container has a command, which runs in the guest through cocoon's vm exec or SSH, and neither is available: " +
			"this cocoon has no vm exec and no guest SSH login is configured (--guest-ssh-key-file, --guest-ssh-password); " +
			"upgrade cocoon, configure SSH, or leave command and args empty to let the VM's init be the workload")
	}
	sb, unlock, err := s.lockSandbox(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	if sb.State != store.SandboxReady {
		return nil, precondition("pod sandbox %s is not ready (stopped); create the container in a running sandbox", sb.ID)
	}
	name := containerName(cfg.GetMetadata(), sb.Name)
	if holder, ok := s.store.Containers.Lookup(store.ContainerNameKey(name)); ok {
		return nil, alreadyExists("container name %q is already reserved for container %s", name, holder.ID)
	}
	img, err := s.images.Get(cfg.GetImage().GetImage())
	if err != nil {
		if errors.Is(err, imagestore.ErrNotFound) {
			return nil, notFound("image %q is not present on this node: pull it, or import it with cocoon-cri image import --ref %s FILE",
				cfg.GetImage().GetImage(), cfg.GetImage().GetImage())
		}
		return nil, toStatus(err)
	}

	id := newID()
	vm, err := s.planVM(id, cfg, sb, img)
	if err != nil {
		return nil, toStatus(err)
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
		return nil, toStatus(fmt.Errorf("record container: %w", err))
	}
	s.emit(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT, c)
	s.log.Info("container created", "container", id, "sandbox", sb.ID, "image", img.ID,
		"vm", vm.Name, "mode", vm.Mode, "cpu", vm.CPU, "memory", vm.Memory, "storage", vm.Storage)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
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
	return nil
}

// logPath is where the kubelet expects the container's log, or empty when it asked for none.
func logPath(dir, rel string) string {
	if dir == "" || rel == "" {
		return ""
	}
	return filepath.Join(dir, rel)
}

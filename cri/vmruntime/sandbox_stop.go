package vmruntime

import (
	"context"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// StopPodSandbox stops every VM of the sandbox at once (the kubelet has already stopped the
// containers gracefully) and marks the sandbox not ready. Stopping a missing or stopped sandbox
// succeeds.
func (s *Runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	sb, unlock, err := s.lockSandbox(req.GetPodSandboxId())
	if err != nil {
		if isNotFound(err) {
			return &runtimeapi.StopPodSandboxResponse{}, nil
		}
		return nil, err
	}
	defer unlock()

	wasStopped := sb.State == store.SandboxNotReady
	for _, c := range s.sandboxContainers(sb.ID) {
		if c.State != store.ContainerRunning {
			continue
		}
		if err := s.stopVM(ctx, sb, c, 0); err != nil {
			return nil, fmt.Errorf("stop container %s: %w", c.ID, err)
		}
	}
	// Releasing the network records a ready sandbox stopped as well.
	if err := s.detachSandbox(ctx, sb); err != nil {
		return nil, err
	}
	if sb.State != store.SandboxNotReady {
		if _, err := s.store.Sandboxes.Modify(sb.ID, func(r *store.Sandbox) error {
			r.State = store.SandboxNotReady
			return nil
		}); err != nil {
			return nil, fmt.Errorf("record sandbox stopped: %w", err)
		}
	}
	if !wasStopped {
		s.log.Info("sandbox stopped", "sandbox", sb.ID)
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (s *Runtime) sandboxContainers(sandboxID string) []*store.Container {
	return s.store.Containers.List(func(c *store.Container) bool { return c.SandboxID == sandboxID })
}

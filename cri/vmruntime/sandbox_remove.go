package vmruntime

import (
	"context"
	"errors"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// RemovePodSandbox removes the sandbox's VMs, containers, network namespace and record. Removing a
// missing sandbox succeeds; a running one is stopped first, as the CRI asks.
func (s *Runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if err := s.removeSandbox(ctx, req.GetPodSandboxId()); err != nil {
		if isNotFound(err) {
			return &runtimeapi.RemovePodSandboxResponse{}, nil
		}
		return nil, err
	}
	// The containers may have been the last users of a removed image's artifact.
	if err := s.images.Sweep(ctx); err != nil {
		s.log.Warn("deleting unused image artifacts failed; the next removal retries", "err", err)
	}
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (s *Runtime) removeSandbox(ctx context.Context, id string) error {
	sb, unlock, err := s.lockSandbox(id)
	if err != nil {
		return err
	}
	defer unlock()
	for _, c := range s.sandboxContainers(sb.ID) {
		if err := s.removeContainer(ctx, sb, c); err != nil {
			return fmt.Errorf("remove container %s: %w", c.ID, err)
		}
	}
	if err := s.detachSandbox(ctx, sb); err != nil {
		return err
	}
	if err := s.net.RemoveCocoon(sb.ID); err != nil {
		return err
	}
	if sb.NetNS != "" {
		if err := s.net.RemoveNetNS(sb.NetNS); err != nil {
			return fmt.Errorf("remove network namespace: %w", err)
		}
	}
	if err := s.store.Sandboxes.Delete(sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete sandbox record: %w", err)
	}
	s.log.Info("sandbox removed", "sandbox", sb.ID)
	return nil
}

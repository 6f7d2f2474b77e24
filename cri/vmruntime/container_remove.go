package vmruntime

import (
	"context"
	"errors"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// RemoveContainer removes the VM (forcibly if it runs, as the CRI asks) and the record. Removing a
// missing container succeeds.
func (s *Runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	c, sb, unlock, err := s.lockContainer(req.GetContainerId())
	if err != nil {
		if isNotFound(err) {
			return &runtimeapi.RemoveContainerResponse{}, nil
		}
		return nil, err
	}
	err = s.removeContainer(ctx, sb, c)
	unlock()
	if err != nil {
		return nil, err
	}
	// The container may have been the last user of a removed image's artifact.
	if err := s.images.Sweep(ctx); err != nil {
		s.log.Warn("deleting unused image artifacts failed; the next removal retries", "err", err)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

// removeContainer deletes the container's VM and record. cocoon's CNI DEL on the VM's network runs
// the attach plugin, which hands a running VM's pod interface back. The caller holds the sandbox
// lock.
func (s *Runtime) removeContainer(ctx context.Context, sb *store.Sandbox, c *store.Container) error {
	s.stopIO(c.ID)
	// A container that never recorded a VM ID may still have a VM from a start a crash cut short:
	// its name is deterministic.
	ref := c.VM.ID
	if ref == "" {
		ref = c.VM.Name
	}
	if err := s.cocoonFor(sb).VMRemove(ctx, ref, true); err != nil && !errors.Is(err, cocoon.ErrNotFound) {
		return fmt.Errorf("remove VM %s: %w", ref, err)
	}
	// Before the record goes, so a cgroup still busy is retried by the kubelet's next removal.
	if err := s.removeCgroup(ctx, sb, c, "", cgroupRemoveWait); err != nil {
		return err
	}
	if err := s.shares.release(c); err != nil {
		return err
	}
	if err := s.store.Containers.Delete(c.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete container record: %w", err)
	}
	s.emit(runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, c)
	s.log.Info("container removed", "container", c.ID, "vm", ref)
	return nil
}

package vmruntime

import (
	"fmt"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// Shared by the RPCs: a pod's or container's record found and held under its sandbox's lock, and
// the cocoon that runs a pod's VMs.

// lockSandbox resolves a sandbox ID (or unique prefix), locks it and returns the record read under
// the lock.
func (s *Runtime) lockSandbox(idOrPrefix string) (*store.Sandbox, func(), error) {
	if idOrPrefix == "" {
		return nil, nil, invalid("pod sandbox ID is required")
	}
	id, err := s.store.Sandboxes.Resolve(idOrPrefix)
	if err != nil {
		return nil, nil, err
	}
	unlock := s.locks.Lock(id)
	sb, err := s.store.Sandboxes.Get(id)
	if err != nil || sb.State == store.SandboxCreating {
		unlock()
		if err == nil {
			err = fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
		}
		return nil, nil, err
	}
	return sb, unlock, nil
}

// lockContainer resolves a container ID (or unique prefix), locks its sandbox and returns both
// records read under the lock.
func (s *Runtime) lockContainer(idOrPrefix string) (*store.Container, *store.Sandbox, func(), error) {
	c, err := s.findContainer(idOrPrefix)
	if err != nil {
		return nil, nil, nil, err
	}
	id := c.ID
	unlock := s.locks.Lock(c.SandboxID)
	if c, err = s.store.Containers.Get(id); err != nil {
		unlock()
		return nil, nil, nil, err
	}
	sb, err := s.store.Sandboxes.Get(c.SandboxID)
	if err != nil {
		unlock()
		return nil, nil, nil, fmt.Errorf("sandbox of container %s: %w", id, err)
	}
	return c, sb, unlock, nil
}

// cocoonFor is the cocoon client for a sandbox's VMs: every call on them (create, clone, start, rm)
// must see the sandbox's network configuration, which names the attach plugin. Guest DNS servers
// follow the pod's DNS config.
func (s *Runtime) cocoonFor(sb *store.Sandbox) Cocoon {
	return s.cocoon.WithNetwork(s.net.CocoonConfDir(sb.ID), s.net.PluginDir(), sb.Config.Msg.GetDnsConfig().GetServers())
}

package tapmanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// RemoveLeftovers removes what pod networks left on the node for sandboxes not in known: CNI
// attachments (released with a DEL built from libcni's cache, so IP leases and port mappings go
// too), cocoon's per-sandbox configuration, and cocoon-cri's network namespaces. cocoon-cri's own
// removal deletes the sandbox record last, so leftovers come from outside: a state database
// restored from a backup or deleted by hand. It returns what it removed.
func (m *Manager) RemoveLeftovers(ctx context.Context, known map[string]bool) ([]string, error) {
	var removed []string
	var errs []error
	attachments, err := m.cni.GetCachedAttachments("")
	if err != nil {
		errs = append(errs, fmt.Errorf("read the CNI cache: %w", err))
	}
	for _, a := range attachments {
		if known[a.ContainerID] {
			continue
		}
		if err := m.delCached(ctx, a); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, fmt.Sprintf("CNI attachment of %s to %s", a.ContainerID, a.Network))
	}

	pods := filepath.Join(m.stateDir, "pods")
	entries, err := os.ReadDir(pods)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("read %s: %w", pods, err))
	}
	for _, e := range entries {
		if known[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(pods, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "cocoon network configuration of "+e.Name())
	}

	knownNetNS := map[string]bool{}
	for id := range known {
		knownNetNS[m.NetNSPath(id)] = true
	}
	namespaces, err := os.ReadDir(m.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("read %s: %w", m.Dir, err))
	}
	for _, e := range namespaces {
		path := filepath.Join(m.Dir, e.Name())
		if !strings.HasPrefix(e.Name(), NetNSPrefix) || knownNetNS[path] {
			continue
		}
		if err := m.RemoveNetNS(path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "network namespace "+path)
	}
	return removed, errors.Join(errs...)
}

// delCached detaches an attachment using only what libcni cached when it was added.
func (m *Manager) delCached(ctx context.Context, a *libcni.NetworkAttachment) error {
	list, err := libcni.ConfListFromBytes(a.Config)
	if err != nil {
		return fmt.Errorf("cached CNI configuration of %s: %w", a.ContainerID, err)
	}
	rc := &libcni.RuntimeConf{ContainerID: a.ContainerID, IfName: a.IfName, Args: a.CniArgs, CapabilityArgs: a.CapabilityArgs}
	if IsNetNS(a.NetNS) {
		rc.NetNS = a.NetNS
	}
	if err := m.cni.DelNetworkList(ctx, list, rc); err != nil {
		return fmt.Errorf("CNI DEL of %s from %q: %w", a.ContainerID, list.Name, err)
	}
	return nil
}

package cocoonsim

import (
	"context"
	"errors"
	"fmt"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// Networking, as cocoon does it (network/, cmd/vm/run.go, cmd/vm/lifecycle.go). A VM's NICs come
// from one provider: CNI (the default: a netns of its own, a libcni ADD per NIC, a TAP wired to
// the CNI interface with tc) or --bridge (TAPs on an existing bridge). The commands create the
// network before the VM record and roll it back when the VM cannot be created; vm rm releases
// it; vm start first recreates a network that vanished (recoverNetwork).

// network_configs backend values.
const (
	backendCNI    = "cni"
	backendBridge = "bridge"
)

var errNetworkNotConfigured = errors.New("network provider not configured")

// networkProvider is cocoon's network.Network as far as the VM commands use it.
type networkProvider interface {
	// config sets up numNICs NICs for vmID, with TAPs of queues virtio-net queues (0: derived from
	// the vCPUs; Firecracker opens its TAPs single-queue). With existing configs it is a
	// recovery: the NICs are recreated with their persisted MACs (and IPs, where IPAM honours them).
	config(ctx context.Context, vmID string, numNICs int, vmCfg *cocoon.VMConfig, queues int, existing ...*cocoon.NetworkConfig) ([]*cocoon.NetworkConfig, error)
	// verify reports whether the VM's network is still in place.
	verify(vmID string) error
	// remove releases the network of deleted VMs.
	remove(ctx context.Context, vmIDs []string) error
}

// initNetwork configures the NICs of a new VM and returns the provider that owns them, for a
// rollback. No NICs means no network at all. A CNI config records the conflist it used in
// vmCfg.Network.
func (a *app) initNetwork(ctx context.Context, vmID string, nics int, vmCfg *cocoon.VMConfig, queues int, bridgeDev string) (networkProvider, []*cocoon.NetworkConfig, error) {
	if nics <= 0 {
		return nil, nil, nil
	}
	provider, err := a.newProvider(bridgeDev)
	if err != nil {
		return nil, nil, fmt.Errorf("init network: %w", err)
	}
	configs, err := provider.config(ctx, vmID, nics, vmCfg, queues)
	if err != nil {
		return nil, nil, fmt.Errorf("configure network: %w", err)
	}
	return provider, configs, nil
}

func (a *app) newProvider(bridgeDev string) (networkProvider, error) {
	if bridgeDev != "" {
		b, err := newBridgeNetwork(bridgeDev)
		if err != nil {
			return nil, fmt.Errorf("init bridge network: %w", err)
		}
		return b, nil
	}
	c, err := newCNINetwork(a.conf, a.log)
	if err != nil {
		return nil, fmt.Errorf("init network: %w", err)
	}
	return c, nil
}

// rollbackNetwork releases the network of a VM that could not be created or cloned.
func (a *app) rollbackNetwork(ctx context.Context, provider networkProvider, vmID string) {
	if provider == nil {
		return
	}
	if err := provider.remove(ctx, []string{vmID}); err != nil {
		a.log.with("cmd.vm.rollbackNetwork").Warnf("rollback network for %s: %v", vmID, err)
	}
}

// releaseNetworks is the network cleanup of vm rm: the CNI networks of the deleted VMs (skipped,
// as in cocoon, when the CNI provider cannot even be set up), then any bridge TAPs.
func (a *app) releaseNetworks(ctx context.Context, vmIDs []string) error {
	if cni, err := newCNINetwork(a.conf, a.log); err == nil {
		if err := cni.remove(ctx, vmIDs); err != nil {
			return fmt.Errorf("vm(s) deleted but network cleanup failed: %w", err)
		}
	}
	cleanupBridgeTAPs(vmIDs)
	return nil
}

// recoverNetworks is cocoon's recoverNetwork, run by vm start before anything starts: a VM whose
// network vanished (its netns or first TAP is missing, e.g. after a host reboot) gets it
// recreated from its persisted NIC configs. Failures are only logged; the start then fails.
func (a *app) recoverNetworks(ctx context.Context, b *backend, refs []string) {
	logger := a.log.with("cmd.vm.recoverNetwork")
	var cni networkProvider
	if c, err := newCNINetwork(a.conf, a.log); err == nil {
		cni = c
	}
	bridges := map[string]networkProvider{}
	for _, ref := range refs {
		vm, err := b.inspect(ctx, ref)
		if err != nil || len(vm.NetworkConfigs) == 0 {
			continue
		}
		provider, err := providerForVM(cni, bridges, vm.NetworkConfigs[0])
		if err != nil {
			logger.Warnf("skip recovery for VM %s: %v", vm.ID, err)
			continue
		}
		if provider.verify(vm.ID) == nil {
			continue
		}
		logger.Warnf("network missing for VM %s, recovering", vm.ID)
		if _, err := provider.config(ctx, vm.ID, len(vm.NetworkConfigs), &vm.Config, vm.NetworkConfigs[0].NumQueues, vm.NetworkConfigs...); err != nil {
			logger.Warnf("recover network for VM %s: %v (start will fail)", vm.ID, err)
		}
	}
}

// providerForVM picks the provider that made a VM's NICs (they all share one); bridge providers
// are cached by device.
func providerForVM(cni networkProvider, bridges map[string]networkProvider, first *cocoon.NetworkConfig) (networkProvider, error) {
	if first.Backend == backendBridge {
		if first.BridgeDev == "" {
			return nil, fmt.Errorf("bridge backend but no bridge device persisted")
		}
		if p, ok := bridges[first.BridgeDev]; ok {
			return p, nil
		}
		b, err := newBridgeNetwork(first.BridgeDev)
		if err != nil {
			return nil, fmt.Errorf("init bridge network: %w", err)
		}
		bridges[first.BridgeDev] = b
		return b, nil
	}
	if cni == nil {
		return nil, fmt.Errorf("cni provider not available")
	}
	return cni, nil
}

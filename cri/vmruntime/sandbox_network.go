package vmruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/containernetworking/cni/libcni"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
)

// The pod network, in the order of a sandbox's life: the cluster's CNI attaches the pod's namespace
// (RunPodSandbox); each VM takes the pod interface over through cocoon and the attach plugin
// (StartContainer), from the pod's namespace or from the stopped VM that kept it; a removed VM
// gives it back (the plugin's DEL in vm rm); the cluster's CNI detaches the pod once the interface
// is back (StopPodSandbox); the namespace goes with the sandbox (RemovePodSandbox).

// loadNetwork picks the network a new sandbox joins: the one named by the pod's network
// annotation, or the node's default. A pod may name only the default network and those the
// operator allows: the directory may hold networks pods must not join (a management network).
func (s *Runtime) loadNetwork(name string) (*libcni.NetworkConfigList, error) {
	list, err := s.net.Load("")
	if errors.Is(err, tapmanager.ErrNoNetwork) {
		return nil, precondition("the node's pod network is not ready: %v", err)
	}
	if err != nil || name == "" || list.Name == name {
		return list, err
	}
	if !slices.Contains(s.cfg.AllowedNetworks, name) {
		return nil, invalid("annotation %s=%q: pods may join the node's default network (%s) and those the operator allows with --allowed-networks (%q)",
			AnnotationNetwork, name, list.Name, s.cfg.AllowedNetworks)
	}
	list, err = s.net.Load(name)
	if unknown := (*tapmanager.UnknownNetworkError)(nil); errors.As(err, &unknown) {
		return nil, invalid("annotation %s=%q: %v", AnnotationNetwork, name, err)
	}
	if errors.Is(err, tapmanager.ErrNoNetwork) {
		return nil, precondition("the node's pod network is not ready: %v", err)
	}
	return list, err
}

// attachSandbox runs the cluster's CNI ADD in the sandbox's namespace and prepares the
// configuration through which its VMs take the interface over.
func (s *Runtime) attachSandbox(ctx context.Context, sb *store.Sandbox, list *libcni.NetworkConfigList) error {
	result, err := s.net.Add(ctx, list, podForCNI(sb))
	if err != nil {
		return err
	}
	faultpoint.Hit(faultpoint.SandboxCNIAdded)
	data, err := json.Marshal(result)
	if err != nil {
		return fmt.Errorf("encode CNI result: %w", err)
	}
	if err := s.net.PrepareCocoon(sb.ID, sb.NetNS, data); err != nil {
		return err
	}
	ips, mac := tapmanager.PodAddresses(result)
	sb.Network.Result, sb.Network.IPs, sb.Network.MAC = data, ips, mac
	return nil
}

// detachSandbox runs the cluster's CNI DEL once: it releases the pod's IP and whatever the plugins
// set up for it (host ports, the veth). A ready sandbox is recorded stopped with it.
func (s *Runtime) detachSandbox(ctx context.Context, sb *store.Sandbox) error {
	if sb.Network == nil || sb.Network.Released {
		return nil
	}
	// The plugins release what they find on the interface in the pod's namespace (a bridge's
	// masquerade rules go by its addresses, the veth by its name): a stopped VM that kept it gives
	// it back first, and one a warm pool hand-over wired gets its addresses back. None of the
	// sandbox's VMs runs by now.
	for _, c := range s.sandboxContainers(sb.ID) {
		if err := s.reclaimInterface(sb, c); err != nil {
			return err
		}
	}
	if len(sb.Network.Result) > 0 {
		if err := s.net.RestorePodInterface(sb.ID, sb.NetNS, sb.Network.Result); err != nil {
			return err
		}
	}
	if err := s.net.Del(ctx, sb.Network.ConfList, podForCNI(sb)); err != nil {
		return err
	}
	// A ready sandbox without its network is stopped: one commit says both.
	released, err := s.store.Sandboxes.Modify(sb.ID, func(r *store.Sandbox) error {
		r.Network.Released, r.Network.IPs = true, nil
		if r.State == store.SandboxReady {
			r.State = store.SandboxNotReady
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record network released: %w", err)
	}
	sb.Network.Released, sb.State = true, released.State
	return nil
}

func podForCNI(sb *store.Sandbox) tapmanager.Pod {
	return tapmanager.Pod{SandboxID: sb.ID, NetNS: sb.NetNS, Config: sb.Config.Msg}
}

// reclaimInterface takes the pod interface back from a container's stopped VM, if that VM holds it.
func (s *Runtime) reclaimInterface(sb *store.Sandbox, c *store.Container) error {
	if sb.Network == nil || len(sb.Network.Result) == 0 || c.VM.NetNS == "" {
		return nil
	}
	return s.net.ReclaimFromVM(sb.ID, sb.NetNS, c.VM.NetNS, sb.Network.Result)
}

// reclaimLostVM takes the pod interface back from the namespace of a VM cocoon no longer knows:
// no vm rm will run the attach plugin's DEL for it, and a namespace that outlived its VM would
// keep the interface from the pod's next VM.
func (s *Runtime) reclaimLostVM(sb *store.Sandbox, c *store.Container) error {
	return s.reclaimInterface(sb, c)
}

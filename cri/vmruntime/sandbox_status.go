package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
)

// PodSandboxStatus answers from the store.
func (s *Runtime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	sb, err := s.visibleSandbox(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.PodSandboxStatusResponse{
		Status:             sandboxStatus(sb),
		ContainersStatuses: s.containerStatuses(sb.ID),
		Timestamp:          s.now(),
	}
	if req.GetVerbose() {
		if resp.Info, err = verboseInfo(sandboxInfo{NetNS: sb.NetNS, Network: sb.Network, VM: sb.VM, RuntimeHandler: sb.RuntimeHandler, Config: sb.Config.Msg}); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// containerStatuses are the statuses of a sandbox's containers.
func (s *Runtime) containerStatuses(sandboxID string) []*runtimeapi.ContainerStatus {
	containers := s.sandboxContainers(sandboxID)
	statuses := make([]*runtimeapi.ContainerStatus, 0, len(containers))
	for _, c := range containers {
		statuses = append(statuses, containerStatus(c))
	}
	return statuses
}

// sandboxInfo is the verbose status, for people debugging a pod.
type sandboxInfo struct {
	NetNS          string                       `json:"netns"`
	Network        *store.PodNetwork            `json:"network,omitempty"`
	RuntimeHandler string                       `json:"runtimeHandler"`
	VM             store.VMOptions              `json:"vmOptions"`
	Config         *runtimeapi.PodSandboxConfig `json:"config"`
}

// visibleSandbox resolves an ID to a sandbox the CRI can see: one whose RunPodSandbox finished.
func (s *Runtime) visibleSandbox(idOrPrefix string) (*store.Sandbox, error) {
	if idOrPrefix == "" {
		return nil, invalid("pod sandbox ID is required")
	}
	id, err := s.store.Sandboxes.Resolve(idOrPrefix)
	if err != nil {
		return nil, err
	}
	sb, err := s.store.Sandboxes.Get(id)
	if err != nil {
		return nil, err
	}
	if sb.State == store.SandboxCreating {
		return nil, notFound("pod sandbox %s is still being created", id)
	}
	return sb, nil
}

func sandboxStatus(sb *store.Sandbox) *runtimeapi.PodSandboxStatus {
	cfg := sb.Config.Msg
	return &runtimeapi.PodSandboxStatus{
		Id:        sb.ID,
		Metadata:  cfg.GetMetadata(),
		State:     sandboxState(sb.State),
		CreatedAt: sb.CreatedAt,
		Network:   sandboxNetworkStatus(sb),
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{
			Network: runtimeapi.NamespaceMode_POD,
			Pid:     podPIDMode(cfg),
			Ipc:     runtimeapi.NamespaceMode_POD,
		}}},
		Labels:         cfg.GetLabels(),
		Annotations:    cfg.GetAnnotations(),
		RuntimeHandler: sb.RuntimeHandler,
	}
}

// podPIDMode reports what the pod asked for (POD or CONTAINER); the VM guest has its own PID space
// either way.
func podPIDMode(cfg *runtimeapi.PodSandboxConfig) runtimeapi.NamespaceMode {
	if m := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetPid(); m == runtimeapi.NamespaceMode_CONTAINER {
		return m
	}
	return runtimeapi.NamespaceMode_POD
}

func sandboxState(st store.SandboxState) runtimeapi.PodSandboxState {
	if st == store.SandboxReady {
		return runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return runtimeapi.PodSandboxState_SANDBOX_NOTREADY
}

// sandboxNetworkStatus reports the pod's addresses while it is attached: the primary IP, and the
// others (dual stack) as additional IPs.
func sandboxNetworkStatus(sb *store.Sandbox) *runtimeapi.PodSandboxNetworkStatus {
	st := &runtimeapi.PodSandboxNetworkStatus{}
	if sb.Network == nil || sb.Network.Released || len(sb.Network.IPs) == 0 {
		return st
	}
	st.Ip = sb.Network.IPs[0]
	for _, ip := range sb.Network.IPs[1:] {
		st.AdditionalIps = append(st.AdditionalIps, &runtimeapi.PodIP{Ip: ip})
	}
	return st
}

package vmruntime

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeConfig states the cgroup driver explicitly: the enum's zero value is SYSTEMD, so an empty
// answer would tell a kubelet with the cgroupfs driver the opposite of what cocoon-cri does.
func (s *Runtime) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return &runtimeapi.RuntimeConfigResponse{
		Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: s.CgroupDriver()},
	}, nil
}

// UpdateRuntimeConfig receives the node's pod CIDR. Pod addressing comes from the cluster's CNI
// configuration, which cocoon-cri reads itself, so there is nothing to change.
func (s *Runtime) UpdateRuntimeConfig(_ context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	s.log.Debug("runtime config update", "podCIDR", req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr())
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

package cocoonsim

import (
	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// inspectedVM is a VM as newer cocoon's vm inspect prints it: with "vsock_socket", the hybrid
// vsock socket cocoon-agent is reached on.
type inspectedVM struct {
	*cocoon.VM
	VsockSocket string `json:"vsock_socket,omitempty"`
}

// withVsockSocket adds the vsock socket to what vm inspect prints, unless the simulator plays
// v0.3.8, which has no such field.
func (a *app) withVsockSocket(vm *cocoon.VM) any {
	if !a.profile.Agent {
		return vm
	}
	return inspectedVM{VM: vm, VsockSocket: vsockSocket(vm)}
}

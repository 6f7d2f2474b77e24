package tapmanager

import (
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// PodInterfaceCounters reads the pod interface's counters in the pod's namespace, where it is
// while no VM holds it. A VM's hypervisor runs in the namespace that holds it then, and its
// /proc/<pid>/net/dev is the cheaper read.
func PodInterfaceCounters(podNetNS string) (vmstats.Interface, error) {
	var out vmstats.Interface
	err := withHandle(podNetNS, func(h *netlink.Handle) error {
		link, err := h.LinkByName(PodIfName)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", PodIfName, podNetNS, err)
		}
		st := link.Attrs().Statistics
		if st == nil {
			return fmt.Errorf("%s in %s: the kernel gave no counters", PodIfName, podNetNS)
		}
		out = vmstats.Interface{Name: PodIfName, RxBytes: st.RxBytes, RxErrors: st.RxErrors, TxBytes: st.TxBytes, TxErrors: st.TxErrors}
		return nil
	})
	return out, err
}

package cocoonsim

import (
	"github.com/vishvananda/netlink"
)

// TAP devices as cocoon creates them for cloud-hypervisor's virtio-net (network/utils.go,
// network/tap_linux.go): named after the VM, VNET_HDR and NO_PI, one queue pair per vCPU.
const (
	vmIDPrefixLen = 8
	// defaultNetQueueSize is cocoon's virtio-net ring depth when --queue-size is 0.
	defaultNetQueueSize = 512
	// tapTxQueueLen and tapGROMaxSize are cocoon's best-effort TAP tuning.
	tapTxQueueLen = 10000
	tapGROMaxSize = 65536
)

func vmIDPrefix(vmID string) string {
	if len(vmID) > vmIDPrefixLen {
		return vmID[:vmIDPrefixLen]
	}
	return vmID
}

// netNumQueues is the virtio-net queue count for cpu vCPUs: one TX+RX pair per vCPU, at least one
// pair.
func netNumQueues(cpu int) int {
	if cpu <= 1 {
		return 2
	}
	return cpu * 2
}

func resolveNetQueueSize(queueSize int) int {
	if queueSize > 0 {
		return queueSize
	}
	return defaultNetQueueSize
}

// createTAP creates a persistent TAP whose queue layout matches what cloud-hypervisor opens for
// numQueues queues: multi-queue only when there is more than one queue pair.
func createTAP(name string, numQueues int) error {
	pairs := max(1, numQueues/2)
	flags := netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_NO_PI
	if pairs <= 1 {
		flags |= netlink.TUNTAP_ONE_QUEUE
	} else {
		flags |= netlink.TUNTAP_MULTI_QUEUE_DEFAULTS
	}
	tap := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Queues:    pairs,
		Flags:     flags,
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return err
	}
	// The device persists; the queues netlink opened to create it are the hypervisor's to open.
	for _, fd := range tap.Fds {
		_ = fd.Close()
	}
	return nil
}

// tuneTAP is cocoon's best-effort tuning; failures are ignored as cocoon ignores them.
func tuneTAP(link netlink.Link) {
	if err := netlink.LinkSetTxQLen(link, tapTxQueueLen); err != nil {
		return
	}
	_ = netlink.LinkSetGROMaxSize(link, tapGROMaxSize)
}

package cocoonsim

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
)

// bridgeTAPPrefix names bridge-mode TAPs "bt<VMID[:8]>-<i>".
const bridgeTAPPrefix = "bt"

// bridgeNetwork is cocoon's --bridge provider (network/bridge): per NIC a TAP in the caller's
// own network namespace, enslaved to an existing Linux bridge, with a random MAC. No netns, no
// CNI, no static IP: the guest is left to DHCP on the bridge.
type bridgeNetwork struct {
	dev   string
	index int
}

func newBridgeNetwork(dev string) (*bridgeNetwork, error) {
	if dev == "" {
		return nil, fmt.Errorf("bridge device name is required")
	}
	br, err := netlink.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", dev, err)
	}
	if br.Type() != "bridge" {
		return nil, fmt.Errorf("%s is not a bridge (type: %s)", dev, br.Type())
	}
	return &bridgeNetwork{dev: dev, index: br.Attrs().Index}, nil
}

func bridgeTAPName(vmID string, nic int) string {
	return fmt.Sprintf("%s%s-%d", bridgeTAPPrefix, vmIDPrefix(vmID), nic)
}

func (b *bridgeNetwork) verify(vmID string) error {
	name := bridgeTAPName(vmID, 0)
	if _, err := netlink.LinkByName(name); err != nil {
		return fmt.Errorf("tap %s: %w", name, err)
	}
	return nil
}

// config creates the TAPs; a recovery (existing configs) keeps the persisted MACs.
func (b *bridgeNetwork) config(_ context.Context, vmID string, numNICs int, vmCfg *cocoon.VMConfig, queues int, existing ...*cocoon.NetworkConfig) ([]*cocoon.NetworkConfig, error) {
	br, err := netlink.LinkByIndex(b.index)
	if err != nil {
		return nil, fmt.Errorf("find bridge: %w", err)
	}
	var configs []*cocoon.NetworkConfig
	for i := range numNICs {
		name := bridgeTAPName(vmID, i)
		mac := randomMAC()
		if i < len(existing) && existing[i] != nil {
			mac = existing[i].Mac
		}
		numQueues := cmp.Or(queues, netNumQueues(vmCfg.CPU))
		if err := createTAP(name, numQueues); err != nil {
			return nil, fmt.Errorf("create tap %s: %w", name, err)
		}
		tap, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("find tap %s: %w", name, err)
		}
		if err := netlink.LinkSetMaster(tap, br); err != nil {
			_ = netlink.LinkDel(tap)
			return nil, fmt.Errorf("add %s to %s: %w", name, b.dev, err)
		}
		_ = netlink.LinkSetLearning(tap, false)
		if mtu := br.Attrs().MTU; mtu > 0 {
			_ = netlink.LinkSetMTU(tap, mtu)
		}
		tuneTAP(tap)
		if err := netlink.LinkSetUp(tap); err != nil {
			_ = netlink.LinkDel(tap)
			return nil, fmt.Errorf("set %s up: %w", name, err)
		}
		configs = append(configs, &cocoon.NetworkConfig{
			Tap: name, Mac: mac, NumQueues: numQueues, QueueSize: resolveNetQueueSize(vmCfg.QueueSize),
			Backend: backendBridge, BridgeDev: b.dev,
		})
	}
	return configs, nil
}

func (b *bridgeNetwork) remove(_ context.Context, vmIDs []string) error {
	cleanupBridgeTAPs(vmIDs)
	return nil
}

// cleanupBridgeTAPs deletes bt<VMID[:8]>-0, -1, ... up to the first that does not exist; it needs
// no bridge and is a no-op for VMs without bridge TAPs.
func cleanupBridgeTAPs(vmIDs []string) {
	for _, vmID := range vmIDs {
		for i := 0; ; i++ {
			link, err := netlink.LinkByName(bridgeTAPName(vmID, i))
			if err != nil {
				break
			}
			_ = netlink.LinkDel(link)
		}
	}
}

// randomMAC is a random locally administered unicast MAC.
func randomMAC() string {
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	buf[0] = (buf[0] | 0x02) &^ 0x01
	return net.HardwareAddr(buf).String()
}

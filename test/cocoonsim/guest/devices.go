package guest

import (
	"fmt"
	"slices"
)

// The hypervisor's virtio-net devices: v.nics holds the open TAP queues of every NIC in v.cfg,
// by device ID, whether or not a guest OS is running to use them.

// openNICs gives every NIC of cfg a device ID (cloud-hypervisor's "_net<i>") and opens its TAP.
// On failure nothing stays open.
func (v *vmm) openNICs(cfg *VMConfig) ([]*nic, error) {
	var opened []*nic
	for i := range cfg.Nets {
		n := &cfg.Nets[i]
		if n.ID == "" {
			n.ID = freeNetID(cfg)
		}
		dev, err := openNIC(*n)
		if err != nil {
			for _, d := range opened {
				d.close()
			}
			return nil, err
		}
		opened = append(opened, dev)
	}
	for _, dev := range opened {
		v.nics[dev.net.ID] = dev
	}
	return opened, nil
}

// nicsInOrder are the open devices in the order of cfg.Nets.
func (v *vmm) nicsInOrder(cfg *VMConfig) []*nic {
	var out []*nic
	for _, n := range cfg.Nets {
		if dev := v.nics[n.ID]; dev != nil {
			out = append(out, dev)
		}
	}
	return out
}

func freeNetID(cfg *VMConfig) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("_net%d", i)
		if !slices.ContainsFunc(cfg.Nets, func(n Net) bool { return n.ID == id }) {
			return id
		}
	}
}

func (v *vmm) closeNICs() {
	for id, dev := range v.nics {
		dev.close()
		delete(v.nics, id)
	}
}

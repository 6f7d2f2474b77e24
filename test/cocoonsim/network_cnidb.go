package cocoonsim

import "github.com/cocoonstack/cocoon-cri/pkg/cocoon"

// networkRecord is one NIC in <root>/cni/db/networks.json (cocoon's network/cni/db.go), keyed by a
// generated ID of its own.
type networkRecord struct {
	Network cocoon.Network `json:"network"`
	ID      string         `json:"id"`
	Type    string         `json:"type"` // conflist name
	VMID    string         `json:"vm_id"`
	IfName  string         `json:"if_name"` // eth<i> inside the VM's netns
}

type networkIndex struct {
	Networks map[string]*networkRecord `json:"networks"`
}

func (idx *networkIndex) initMaps() {
	if idx.Networks == nil {
		idx.Networks = map[string]*networkRecord{}
	}
}

// byVMID returns copies of the records of one VM, safe to use once the lock is released.
func (idx *networkIndex) byVMID(vmID string) []networkRecord {
	var out []networkRecord
	for _, rec := range idx.Networks {
		if rec != nil && rec.VMID == vmID {
			out = append(out, *rec)
		}
	}
	return out
}

func (idx *networkIndex) dropVM(vmID string) {
	for id, rec := range idx.Networks {
		if rec != nil && rec.VMID == vmID {
			delete(idx.Networks, id)
		}
	}
}

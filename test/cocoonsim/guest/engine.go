package guest

import (
	"fmt"
	"os"
)

// bootGuestOS starts the operating system of a cold-booted VM behind its NICs, whose TAP queues
// the hypervisor has already opened (in nics order, cfg.Nets order).
//
// This is the one place that decides what runs inside the VM: a real kernel (a bzImage, which test
// images carry to prove the data path) boots under QEMU on the VM's TAPs; anything else is the
// simulated guest OS, which reads its network from the boot args as a guest would. Snapshot
// restore (resumeGuestOS) stays simulated.
func (v *vmm) bootGuestOS(cfg *VMConfig, nics []*nic) (guestOS, error) {
	netState, err := networkFromBootArgs(cfg, v.runDir)
	if err != nil {
		return nil, err
	}
	if cfg.Payload != nil && isBzImage(cfg.Payload.Kernel) {
		return v.startQEMU(cfg, nics, netState)
	}
	if FixedLatency() > 0 {
		return nullOS{v}, nil
	}
	v.printBanner(cfg)
	s, err := v.startSimulatedGuest(netState, nics, nil, 0)
	if err != nil {
		return nil, err
	}
	v.printReady()
	v.console.acceptInput(true)
	return s, nil
}

// resumeGuestOS brings back the guest of a restored snapshot when it first resumes: with the
// network state it had, on the NICs the VM has now, and with the RAM (its /dev/shm) of the
// snapshot's memory file.
func (v *vmm) resumeGuestOS(netState guestNetwork, nics []*nic, ram *restoredRAM) (guestOS, error) {
	if FixedLatency() > 0 {
		return nullOS{v}, nil
	}
	return v.startSimulatedGuest(netState, nics, ram, v.restoredClock)
}

// startSimulatedGuest starts the simulated guest OS; ram, when not nil, is the memory it comes
// back with, and restoredAt, when not 0, the guest's wall time when its snapshot was taken.
func (v *vmm) startSimulatedGuest(netState guestNetwork, nics []*nic, ram *restoredRAM, restoredAt int64) (guestOS, error) {
	plan, err := planGuest(v.runDir, v.spec, netState, v.restoredMachineID)
	if err != nil {
		return nil, err
	}
	if err := v.startGuestClock(restoredAt); err != nil {
		return nil, err
	}
	var shm *os.File
	if ram.hasShm() {
		if shm, err = ram.shmTar(); err != nil {
			return nil, fmt.Errorf("read the snapshot's memory: %w", err)
		}
		plan.RestoreShm = true
	}
	s, err := startSimulatedOS(v.logger, v.name, plan, netState, shm, func() { v.powerOff("the guest shut down") })
	if err != nil {
		return nil, err
	}
	for _, dev := range nics {
		if err := s.plug(dev); err != nil {
			s.stop()
			return nil, fmt.Errorf("plug NIC %s (TAP %s): %w", dev.net.ID, dev.net.Tap, err)
		}
	}
	return s, nil
}

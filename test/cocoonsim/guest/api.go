package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Snapshot files a Cloud Hypervisor snapshot directory holds.
const (
	snapshotConfigFile = "config.json"
	snapshotStateFile  = "state.json"
	snapshotMemoryFile = "memory-range-0"
)

// memoryRestoreOnDemand is CH's UFFD lazy restore mode.
const memoryRestoreOnDemand = "OnDemand"

func (v *vmm) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/vmm.ping", v.handlePing)
	mux.HandleFunc("GET /api/v1/vm.info", v.handleInfo)
	mux.HandleFunc("PUT /api/v1/vm.shutdown", v.handleShutdown)
	mux.HandleFunc("PUT /api/v1/vm.power-button", v.handlePowerButton)
	mux.HandleFunc("PUT /api/v1/vm.pause", v.handlePause)
	mux.HandleFunc("PUT /api/v1/vm.resume", v.handleResume)
	mux.HandleFunc("PUT /api/v1/vm.snapshot", v.handleSnapshot)
	mux.HandleFunc("PUT /api/v1/vm.restore", v.handleRestore)
	mux.HandleFunc("PUT /api/v1/vm.add-disk", v.handleAddDisk)
	mux.HandleFunc("PUT /api/v1/vm.add-net", v.handleAddNet)
	mux.HandleFunc("PUT /api/v1/vm.add-device", v.handleAddDevice)
	mux.HandleFunc("PUT /api/v1/vm.add-fs", v.handleAddFs)
	mux.HandleFunc("PUT /api/v1/vm.remove-device", v.handleRemoveDevice)
	return mux
}

// apiError answers like Cloud Hypervisor does for a failed action: 500 with the reason.
func apiError(w http.ResponseWriter, format string, args ...any) {
	http.Error(w, fmt.Sprintf(format, args...), http.StatusInternalServerError)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (v *vmm) handlePing(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{
		"build_version": "v51.0-cocoon-sim",
		"version":       "51.0",
		"pid":           os.Getpid(),
		"features":      []string{},
	})
}

func (v *vmm) handleInfo(w http.ResponseWriter, _ *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		apiError(w, "VM is not created")
		return
	}
	writeJSON(w, map[string]any{
		"config":             v.cfg,
		"state":              v.state,
		"memory_actual_size": v.cfg.Memory.Size,
	})
}

// handleShutdown destroys the VM at once. As with Cloud Hypervisor, the VMM process itself keeps
// running until it is signalled; cocoon follows vm.shutdown with SIGTERM.
func (v *vmm) handleShutdown(w http.ResponseWriter, _ *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		apiError(w, "VM is not created")
		return
	}
	v.state = stateShutdown
	v.stopGuest()
	v.logger.Printf("vm.shutdown: VM shut down")
	w.WriteHeader(http.StatusNoContent)
}

func (v *vmm) handlePowerButton(w http.ResponseWriter, _ *http.Request) {
	if err := v.pressPowerButton("ACPI: Power Button [PWRF]", "ACPI power button"); err != nil {
		apiError(w, "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pressPowerButton asks the guest to power off (cloud-hypervisor's ACPI power button,
// Firecracker's Ctrl-Alt-Del); the guest prints event on its console and goes down for reason,
// unless its image ignores the request.
func (v *vmm) pressPowerButton(event, reason string) error {
	v.mu.Lock()
	state := v.state
	v.mu.Unlock()
	if state != stateRunning {
		return fmt.Errorf("VM is not running (state %s)", state)
	}
	v.console.Printf("%s %s", v.uptime(), event)
	if v.spec.IgnorePowerButton {
		v.logger.Printf("power button: guest ignores it")
		return nil
	}
	v.mu.Lock()
	real, isReal := v.os.(*qemuOS)
	v.mu.Unlock()
	if isReal {
		go real.pressPowerButton()
		return nil
	}
	go v.powerOff(reason)
	return nil
}

func (v *vmm) handlePause(w http.ResponseWriter, _ *http.Request) {
	v.transition(w, stateRunning, statePaused)
}

// handleResume lets a paused guest run again.
func (v *vmm) handleResume(w http.ResponseWriter, _ *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.resumeLocked(); err != nil {
		apiError(w, "vm.resume: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeLocked lets a paused guest run again. The first resume after a restore brings the
// restored guest back: its OS starts with the network state it had, on the NICs the VM has now.
// The caller holds v.mu.
func (v *vmm) resumeLocked() error {
	if v.state != statePaused {
		return fmt.Errorf("VM is %s, want %s", v.state, statePaused)
	}
	if v.resumePending {
		guestOS, err := v.resumeGuestOS(v.restoredNet, v.nicsInOrder(v.cfg), v.restoredRAM)
		if err != nil {
			return err
		}
		// The guest holds its RAM now; the memory file is no longer needed.
		v.restoredRAM.close()
		v.restoredRAM = nil
		v.os = guestOS
		if err := v.startLoad(); err != nil {
			return err
		}
		v.resumePending = false
		v.console.Printf("%s cocoon-sim: resumed from snapshot", v.uptime())
		v.printReady()
		v.console.acceptInput(true)
		v.startBehaviours()
	}
	v.state = stateRunning
	return nil
}

func (v *vmm) transition(w http.ResponseWriter, from, to string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != from {
		apiError(w, "VM is %s, want %s", v.state, from)
		return false
	}
	v.state = to
	w.WriteHeader(http.StatusNoContent)
	return true
}

// handleSnapshot writes a Cloud Hypervisor snapshot (config.json, state.json, memory ranges) of
// the paused VM into destination_url.
func (v *vmm) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		DestinationURL string `json:"destination_url"`
	}
	dir, err := decodeFileURL(r, &req, &req.DestinationURL)
	if err != nil {
		apiError(w, "vm.snapshot: %v", err)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != statePaused {
		apiError(w, "vm.snapshot: VM is not paused (state %s)", v.state)
		return
	}
	if err := v.writeSnapshot(dir); err != nil {
		apiError(w, "vm.snapshot: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (v *vmm) writeSnapshot(dir string) error {
	for i := range v.cfg.Disks {
		if v.cfg.Disks[i].ID == "" {
			v.cfg.Disks[i].ID = fmt.Sprintf("_disk%d", i)
		}
	}
	cfg, err := json.Marshal(v.cfg)
	if err != nil {
		return err
	}
	st, err := v.guestState()
	if err != nil {
		return err
	}
	state, err := json.Marshal(st)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		snapshotConfigFile: cfg,
		snapshotStateFile:  state,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return v.writeMemory(filepath.Join(dir, snapshotMemoryFile))
}

// guestState is what a snapshot keeps of the paused guest. The caller holds v.mu.
func (v *vmm) guestState() (snapshotState, error) {
	netState := v.restoredNet
	if v.os != nil {
		var err error
		if netState, err = v.os.network(); err != nil {
			return snapshotState{}, err
		}
	}
	machineID, err := readMachineID(v.runDir)
	if err != nil {
		return snapshotState{}, err
	}
	// The guest's clock as the vCPUs left it: a restored guest that has not resumed yet still has
	// its snapshot's. A real kernel's is QEMU's, and the benchmark's null guest has none.
	var clock int64
	switch v.os.(type) {
	case *simulatedOS:
		if clock, err = guestWallTime(v.runDir); err != nil {
			return snapshotState{}, err
		}
	case nil:
		clock = v.restoredClock
	}
	return snapshotState{VMName: v.name, State: v.state, CPUs: v.cfg.CPUs.BootVCPUs, GuestNetwork: &netState, MachineID: machineID, GuestClock: clock}, nil
}

// writeMemory writes the paused guest's RAM to a snapshot's memory file (see memimage.go): the
// running simulated guest's /dev/shm, read through its root; or, for a restored guest that has
// not resumed yet, what it was restored with. A real kernel's RAM is QEMU's, and the benchmark's
// null guest has none. The caller holds v.mu.
func (v *vmm) writeMemory(path string) error {
	var ram func(io.Writer) error
	switch guest := v.os.(type) {
	case *simulatedOS:
		ram = writeShmSection(guest.shmDir())
	case nil:
		if v.restoredRAM.hasShm() {
			ram = v.restoredRAM.copyShmSection
		}
	}
	return writeMemoryFile(path, v.name, ram)
}

// handleRestore loads a snapshot directory into a hypervisor that has no VM yet. The VM comes up
// paused; vm.resume lets the guest run.
func (v *vmm) handleRestore(w http.ResponseWriter, r *http.Request) {
	var req struct {
		SourceURL         string `json:"source_url"`
		MemoryRestoreMode string `json:"memory_restore_mode"`
	}
	dir, err := decodeFileURL(r, &req, &req.SourceURL)
	if err != nil {
		apiError(w, "vm.restore: %v", err)
		return
	}
	cfg, restored, err := readSnapshot(dir)
	if err != nil {
		apiError(w, "vm.restore: %v", err)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg != nil {
		apiError(w, "vm.restore: VM is already created")
		return
	}
	if restored.ram, err = openMemoryFile(filepath.Join(dir, snapshotMemoryFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		apiError(w, "vm.restore: %v", err)
		return
	}
	if req.MemoryRestoreMode == memoryRestoreOnDemand {
		if err := v.watchMemoryFiles(dir); err != nil {
			restored.ram.close()
			apiError(w, "vm.restore: %v", err)
			return
		}
	}
	if err := v.restoreLocked(cfg, restored); err != nil {
		restored.ram.close()
		apiError(w, "vm.restore: %v", err)
		return
	}
	v.logger.Printf("vm.restore: restored from %s (memory_restore_mode=%q)", dir, req.MemoryRestoreMode)
	w.WriteHeader(http.StatusNoContent)
}

// restoreLocked brings a snapshot's VM up paused in this empty hypervisor: its console, its
// NICs (reopening the TAPs cfg names) and the guest state that comes back on the first resume.
// The caller holds v.mu.
func (v *vmm) restoreLocked(cfg *VMConfig, restored restoredGuest) error {
	if err := v.attachConsole(cfg); err != nil {
		return err
	}
	if _, err := v.openNICs(cfg); err != nil {
		return err
	}
	v.cfg = cfg
	v.state = statePaused
	v.resumePending = true
	v.restoredNet = restored.net
	v.restoredMachineID = restored.machineID
	v.restoredClock = restored.clock
	v.restoredRAM = restored.ram
	return nil
}

// snapshotState is the simulator's state.json: what cloud-hypervisor keeps of device and guest
// state, here the guest's network state.
type snapshotState struct {
	VMName       string        `json:"vm_name"`
	State        string        `json:"state"`
	CPUs         int           `json:"cpus,omitempty"`
	GuestNetwork *guestNetwork `json:"guest_network,omitempty"`
	// MachineID is the guest's /etc/machine-id: part of the disk and memory a clone inherits.
	MachineID string `json:"machine_id,omitempty"`
	// GuestClock is the guest's wall time at the capture, in Unix nanoseconds (kvmclock, as
	// cloud-hypervisor saves it): a guest restored from the snapshot goes on from there.
	GuestClock int64 `json:"guest_clock_ns,omitempty"`
}

// restoredGuest is what a snapshot keeps of the guest OS.
type restoredGuest struct {
	net       guestNetwork
	machineID string
	// clock is the guest's wall time at the capture (Unix nanoseconds), 0 when not recorded.
	clock int64
	// ram is the snapshot's memory file; nil when it has none the simulator can read.
	ram *restoredRAM
}

// readSnapshot loads a snapshot's configuration and the guest's state. A state.json without a
// network state (a snapshot not made by the simulator) leaves the guest to what its boot args say.
func readSnapshot(dir string) (*VMConfig, restoredGuest, error) {
	data, err := os.ReadFile(filepath.Join(dir, snapshotConfigFile)) //nolint:gosec // snapshot dir
	if err != nil {
		return nil, restoredGuest{}, err
	}
	var cfg VMConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, restoredGuest{}, fmt.Errorf("decode %s: %w", snapshotConfigFile, err)
	}
	stateData, err := os.ReadFile(filepath.Join(dir, snapshotStateFile)) //nolint:gosec // snapshot dir
	if err != nil {
		return nil, restoredGuest{}, err
	}
	var state snapshotState
	if err := json.Unmarshal(stateData, &state); err != nil {
		return nil, restoredGuest{}, fmt.Errorf("decode %s: %w", snapshotStateFile, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, restoredGuest{}, err
	}
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), "memory-range") }) {
		return nil, restoredGuest{}, errors.New("no memory-range file in snapshot")
	}
	restored := restoredGuest{machineID: state.MachineID, clock: state.GuestClock}
	if state.GuestNetwork != nil {
		restored.net = *state.GuestNetwork
		return &cfg, restored, nil
	}
	restored.net, err = networkFromBootArgs(&cfg, dir)
	return &cfg, restored, err
}

func (v *vmm) handleAddDisk(w http.ResponseWriter, r *http.Request) {
	var disk Disk
	if !decodeDevice(w, r, "vm.add-disk", &disk) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.admitDevice(w, "vm.add-disk", &disk.ID, "_disk", func() int { return len(v.cfg.Disks) }) {
		return
	}
	// A data disk (one with a serial) reaches a running guest; the simulated guest opens no
	// other disk.
	if v.os != nil && disk.Serial != "" {
		dev, err := v.os.plugDisk(disk)
		if err != nil {
			apiError(w, "vm.add-disk: %v", err)
			return
		}
		if v.diskDevs == nil {
			v.diskDevs = map[string]string{}
		}
		v.diskDevs[disk.ID] = dev
	}
	v.cfg.Disks = append(v.cfg.Disks, disk)
	writeJSON(w, map[string]string{"id": disk.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 0x10+len(v.cfg.Disks))})
}

// handleAddNet hot-plugs a NIC: its TAP is opened at once and, if a guest runs, the guest gets
// it. Like cloud-hypervisor it answers 200 with the new device's ID.
func (v *vmm) handleAddNet(w http.ResponseWriter, r *http.Request) {
	var n Net
	if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
		apiError(w, "vm.add-net: %v", err)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		apiError(w, "VM is not created")
		return
	}
	if n.ID == "" || v.nics[n.ID] != nil {
		n.ID = freeNetID(v.cfg)
	}
	dev, err := openNIC(n)
	if err != nil {
		apiError(w, "vm.add-net: %v", err)
		return
	}
	if v.os != nil {
		if err := v.os.plug(dev); err != nil {
			dev.close()
			apiError(w, "vm.add-net: %v", err)
			return
		}
	}
	v.nics[n.ID] = dev
	v.cfg.Nets = append(v.cfg.Nets, n)
	writeJSON(w, map[string]string{"id": n.ID, "bdf": fmt.Sprintf("0000:00:%02x.0", 0x10+len(v.cfg.Disks)+len(v.cfg.Nets))})
}

// handleRemoveDevice unplugs a NIC (closing its TAP, and taking it from the guest), a disk, a
// passed-through PCI device or a virtio-fs device.
func (v *vmm) handleRemoveDevice(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, "vm.remove-device: %v", err)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		apiError(w, "VM is not created")
		return
	}
	isNet := func(n Net) bool { return n.ID == req.ID }
	isDisk := func(d Disk) bool { return d.ID == req.ID }
	switch {
	case slices.ContainsFunc(v.cfg.Nets, isNet):
		if v.os != nil {
			v.os.unplug(req.ID)
		}
		if dev := v.nics[req.ID]; dev != nil {
			dev.close()
			delete(v.nics, req.ID)
		}
		v.cfg.Nets = slices.DeleteFunc(v.cfg.Nets, isNet)
	case slices.ContainsFunc(v.cfg.Disks, isDisk):
		if dev := v.diskDevs[req.ID]; dev != "" && v.os != nil {
			i := slices.IndexFunc(v.cfg.Disks, isDisk)
			if err := v.os.unplugDisk(dev, v.cfg.Disks[i].Serial); err != nil {
				apiError(w, "vm.remove-device: %v", err)
				return
			}
		}
		delete(v.diskDevs, req.ID)
		v.cfg.Disks = slices.DeleteFunc(v.cfg.Disks, isDisk)
	case slices.ContainsFunc(v.cfg.Devices, func(d Device) bool { return d.ID == req.ID }):
		v.removeVFIODevice(req.ID)
	case slices.ContainsFunc(v.cfg.Fs, func(f Fs) bool { return f.ID == req.ID }):
		v.removeFs(req.ID)
	default:
		apiError(w, "vm.remove-device: no device with id %q", req.ID)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeFileURL decodes a request whose target is a file:// URL and returns the local path.
func decodeFileURL(r *http.Request, req any, rawURL *string) (string, error) {
	if err := json.NewDecoder(r.Body).Decode(req); err != nil {
		return "", fmt.Errorf("decode request: %w", err)
	}
	u, err := url.Parse(*rawURL)
	if err != nil || u.Scheme != "file" {
		return "", fmt.Errorf("want a file:// URL, got %q", *rawURL)
	}
	return u.Path, nil
}

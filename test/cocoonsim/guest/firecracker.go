package guest

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FirecrackerVersion is what the simulated Firecracker reports: the first release cocoon v0.5
// clones with (vsock_override) that keeps the guest's vsock working after a load.
const FirecrackerVersion = "1.16.1"

// Firecracker's snapshot files, as cocoon names them.
const (
	FCStateFile  = "vmstate"
	FCMemoryFile = "mem"
)

// fcVsockCID is the guest CID cocoon gives every Firecracker VM.
const fcVsockCID = 3

// isFirecrackerArgs tells Firecracker's command line (cocoon passes --api-sock) from
// cloud-hypervisor's (--api-socket).
func isFirecrackerArgs(args []string) bool {
	for _, a := range args {
		if a == "--api-sock" || strings.HasPrefix(a, "--api-sock=") {
			return true
		}
	}
	return false
}

// fcVMM is a simulated Firecracker process: the same guest as under cloud-hypervisor, driven
// through Firecracker's API. Nothing is configured on the command line: the VM is described piece
// by piece over the API and booted by InstanceStart, or loaded from a snapshot.
type fcVMM struct {
	*vmm
	id string

	fcMu      sync.Mutex // guards pending and vsock
	pending   VMConfig   // the machine being described, until InstanceStart
	vsock     net.Listener
	vsockPath string
}

// runFirecracker is the Firecracker process: `firecracker --api-sock S --log-path L --level X
// --id ID`. Its stdin and stdout are the guest's serial port; its log goes to the log path, which
// must exist (Firecracker opens it without creating it).
func runFirecracker(name string, args []string) int {
	fs := flag.NewFlagSet("firecracker", flag.ContinueOnError)
	apiSock := fs.String("api-sock", "", "")
	logPath := fs.String("log-path", "", "")
	_ = fs.String("level", "Warning", "")
	id := fs.String("id", "anonymous-instance", "")
	if err := fs.Parse(args); err != nil || *apiSock == "" || fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "firecracker(sim): invalid arguments %q\n", args) //nolint:errcheck
		return 1
	}
	var logOut io.Writer = io.Discard
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND, 0) //nolint:gosec // the VM's log
		if err != nil {
			fmt.Fprintf(os.Stderr, "firecracker(sim): open log %s: %v\n", *logPath, err) //nolint:errcheck
			return 1
		}
		defer f.Close() //nolint:errcheck
		logOut = f
	}
	logger := log.New(logOut, "firecracker(sim): ", log.LstdFlags|log.Lmicroseconds)
	v := &fcVMM{
		vmm: &vmm{
			name:   name,
			runDir: filepath.Dir(*apiSock),
			logger: logger,
			exit:   make(chan int, 1),
			booted: time.Now(),
			state:  stateCreated,
			nics:   map[string]*nic{},
			// Firecracker's x86_64 machine has no RTC: a guest's hwclock finds none.
			noRTC: true,
		},
		id: *id,
	}
	v.pending.RNG.Src = "/dev/urandom"
	v.pending.Serial = &RuntimeFile{Mode: ModeTty}
	var err error
	if v.spec, err = ReadSpec(v.runDir); err != nil {
		logger.Printf("guest behaviour: %v", err)
		return 1
	}
	if v.spec.FailBoot {
		logger.Printf("simulated boot failure (%s: fail_boot)", SpecFile)
		return 1
	}
	defer v.closeVsock()
	if err := os.Remove(*apiSock); err != nil && !errors.Is(err, os.ErrNotExist) {
		logger.Printf("remove stale api socket: %v", err)
		return 1
	}
	ln, err := net.Listen("unix", *apiSock)
	if err != nil {
		logger.Printf("listen %s: %v", *apiSock, err)
		return 1
	}
	go func() { _ = http.Serve(ln, v.routes()) }() //nolint:gosec // unix socket, local only
	logger.Printf("API server listening on %s (pid %d)", *apiSock, os.Getpid())

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	select {
	case sig := <-signals:
		logger.Printf("received %v, exiting", sig)
		return 0
	case code := <-v.exit:
		return code
	}
}

func (v *fcVMM) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", v.handleInstanceInfo)
	mux.HandleFunc("PUT /machine-config", configure(v, applyMachineConfig))
	mux.HandleFunc("PUT /boot-source", configure(v, applyBootSource))
	mux.HandleFunc("PUT /drives/{id}", configure(v, applyDrive))
	mux.HandleFunc("PATCH /drives/{id}", v.handlePatchDrive)
	mux.HandleFunc("PUT /network-interfaces/{id}", configure(v, applyNetworkInterface))
	mux.HandleFunc("PUT /balloon", configure(v, applyBalloon))
	mux.HandleFunc("PUT /entropy", configure(v, func(*VMConfig, fcEntropy, *http.Request) error { return nil }))
	mux.HandleFunc("PUT /vsock", configure(v, v.applyVsock))
	mux.HandleFunc("PUT /actions", v.handleAction)
	mux.HandleFunc("PATCH /vm", v.handleVMState)
	mux.HandleFunc("PUT /snapshot/create", v.handleSnapshotCreate)
	mux.HandleFunc("PUT /snapshot/load", v.handleSnapshotLoad)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fcFault(w, "Invalid request method and/or path: %s %s.", r.Method, r.URL.Path)
	})
	return mux
}

// fcFault answers as Firecracker does for a refused request: 400 with a fault message.
func fcFault(w http.ResponseWriter, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"fault_message": fmt.Sprintf(format, args...)})
}

// decodeFC decodes a request body, refusing unknown fields as Firecracker's API does.
func decodeFC(w http.ResponseWriter, r *http.Request, req any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		fcFault(w, "An error occurred when deserializing the json body of a request: %v.", err)
		return false
	}
	return true
}

// configuring runs fn on the machine being described, which is only possible before the guest
// starts.
func (v *fcVMM) configuring(w http.ResponseWriter, fn func(*VMConfig) error) {
	v.mu.Lock()
	started := v.cfg != nil
	v.mu.Unlock()
	if started {
		fcFault(w, "The requested operation is not supported after starting the microVM.")
		return
	}
	v.fcMu.Lock()
	err := fn(&v.pending)
	v.fcMu.Unlock()
	if err != nil {
		fcFault(w, "%v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fcState is the instance state as Firecracker names it.
func (v *fcVMM) fcState() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.cfg == nil:
		return "Not started"
	case v.state == statePaused:
		return "Paused"
	default:
		return "Running"
	}
}

func (v *fcVMM) handleInstanceInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]string{"id": v.id, "state": v.fcState(), "vmm_version": FirecrackerVersion, "app_name": "Firecracker"})
}

// configure is the handler of a PUT that describes the machine before it starts: its body, a T
// (unknown fields refused), is applied by apply, which also sees the request (the device ID in
// its path).
func configure[T any](v *fcVMM, apply func(c *VMConfig, req T, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req T
		if !decodeFC(w, r, &req) {
			return
		}
		v.configuring(w, func(c *VMConfig) error { return apply(c, req, r) })
	}
}

// pathIDMatches is Firecracker's check that a device PUT names the same ID in its path and body.
func pathIDMatches(r *http.Request, id string) error {
	if id != r.PathValue("id") {
		return errors.New("The id from the path does not match the id from the body!")
	}
	return nil
}

type fcMachineConfig struct {
	VCPUCount  int    `json:"vcpu_count"`
	MemSizeMiB int64  `json:"mem_size_mib"`
	HugePages  string `json:"huge_pages,omitempty"`
	SMT        bool   `json:"smt,omitempty"`
}

func applyMachineConfig(c *VMConfig, req fcMachineConfig, _ *http.Request) error {
	if req.VCPUCount < 1 || req.VCPUCount > 32 {
		return errors.New("The vCPU number is invalid! The vCPU number can only be 1 or an even number when SMT is enabled.")
	}
	if req.MemSizeMiB < 1 {
		return errors.New("The memory size (MiB) is invalid.")
	}
	c.CPUs = CPUs{BootVCPUs: req.VCPUCount, MaxVCPUs: req.VCPUCount}
	c.Memory = Memory{Size: req.MemSizeMiB << 20, HugePages: req.HugePages == "2M"}
	return nil
}

type fcBootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	InitrdPath      string `json:"initrd_path,omitempty"`
	BootArgs        string `json:"boot_args,omitempty"`
}

func applyBootSource(c *VMConfig, req fcBootSource, _ *http.Request) error {
	if _, err := os.Stat(req.KernelImagePath); err != nil {
		return fmt.Errorf("The kernel file cannot be opened: %v", err)
	}
	c.Payload = &Payload{Kernel: req.KernelImagePath, Initramfs: req.InitrdPath, Cmdline: req.BootArgs}
	return nil
}

type fcDrive struct {
	DriveID      string `json:"drive_id"`
	PathOnHost   string `json:"path_on_host"`
	IsRootDevice bool   `json:"is_root_device"`
	IsReadOnly   bool   `json:"is_read_only"`
	IOEngine     string `json:"io_engine,omitempty"`
}

func applyDrive(c *VMConfig, req fcDrive, r *http.Request) error {
	if err := pathIDMatches(r, req.DriveID); err != nil {
		return err
	}
	if _, err := os.Stat(req.PathOnHost); err != nil {
		return fmt.Errorf("Unable to create the block device: %v", err)
	}
	c.Disks = upsert(c.Disks, Disk{ID: req.DriveID, Path: req.PathOnHost, ReadOnly: req.IsReadOnly, ImageType: "Raw"}, func(d Disk) string { return d.ID })
	return nil
}

type fcNetworkInterface struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
	GuestMAC    string `json:"guest_mac,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
}

func applyNetworkInterface(c *VMConfig, req fcNetworkInterface, r *http.Request) error {
	if err := pathIDMatches(r, req.IfaceID); err != nil {
		return err
	}
	if _, err := net.ParseMAC(req.GuestMAC); req.GuestMAC != "" && err != nil {
		return fmt.Errorf("Invalid MAC address %q", req.GuestMAC)
	}
	// Firecracker's virtio-net has one queue pair.
	c.Nets = upsert(c.Nets, Net{ID: req.IfaceID, Tap: req.HostDevName, Mac: req.GuestMAC, NumQueues: 2}, func(n Net) string { return n.ID })
	return nil
}

// upsert replaces the device with item's ID, or adds item: a PUT of a device Firecracker already
// has reconfigures it.
func upsert[T any](list []T, item T, id func(T) string) []T {
	for i := range list {
		if id(list[i]) == id(item) {
			list[i] = item
			return list
		}
	}
	return append(list, item)
}

type fcBalloon struct {
	AmountMiB         int64 `json:"amount_mib"`
	DeflateOnOOM      bool  `json:"deflate_on_oom"`
	FreePageReporting bool  `json:"free_page_reporting,omitempty"`
	StatsPollingIntS  int   `json:"stats_polling_interval_s,omitempty"`
}

func applyBalloon(c *VMConfig, req fcBalloon, _ *http.Request) error {
	c.Balloon = &Balloon{Size: req.AmountMiB << 20, DeflateOnOOM: req.DeflateOnOOM, FreePageReporting: req.FreePageReporting}
	return nil
}

type fcEntropy struct {
	RateLimiter json.RawMessage `json:"rate_limiter,omitempty"`
}

type fcVsock struct {
	GuestCID uint32 `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// applyVsock sets up the guest's vsock device, whose host side is the hybrid vsock socket at
// uds_path (the same CONNECT protocol as cloud-hypervisor's). configure holds v.fcMu.
func (v *fcVMM) applyVsock(_ *VMConfig, req fcVsock, _ *http.Request) error {
	if req.GuestCID != fcVsockCID {
		return fmt.Errorf("cocoon-sim: guest_cid %d: the simulated guest has CID %d", req.GuestCID, fcVsockCID)
	}
	return v.openVsockLocked(req.UDSPath)
}

// handlePatchDrive points a started VM's drive at another host file, as cocoon does after a
// clone to move the drives from the snapshot's paths to the clone's.
func (v *fcVMM) handlePatchDrive(w http.ResponseWriter, r *http.Request) {
	var req struct {
		DriveID    string `json:"drive_id"`
		PathOnHost string `json:"path_on_host,omitempty"`
	}
	if !decodeFC(w, r, &req) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		fcFault(w, "The requested operation is not supported before starting the microVM.")
		return
	}
	for i := range v.cfg.Disks {
		if v.cfg.Disks[i].ID == req.DriveID {
			if _, err := os.Stat(req.PathOnHost); err != nil {
				fcFault(w, "Unable to patch the block device: %v", err)
				return
			}
			v.cfg.Disks[i].Path = req.PathOnHost
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	fcFault(w, "Invalid block device ID: %s", req.DriveID)
}

// openVsockLocked binds the vsock device's socket. The caller holds v.fcMu.
func (v *fcVMM) openVsockLocked(path string) error {
	if v.vsock != nil {
		_ = v.vsock.Close()
	}
	ln, err := v.listenVsock(path)
	if err != nil {
		return fmt.Errorf("Cannot create backend for vsock device: %v", err)
	}
	v.vsock, v.vsockPath = ln, path
	return nil
}

func (v *fcVMM) closeVsock() {
	v.fcMu.Lock()
	defer v.fcMu.Unlock()
	if v.vsock != nil {
		_ = v.vsock.Close() // also removes the socket file
	}
}

func (v *fcVMM) handleAction(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ActionType string `json:"action_type"`
	}
	if !decodeFC(w, r, &req) {
		return
	}
	switch req.ActionType {
	case "InstanceStart":
		v.instanceStart(w)
	case "SendCtrlAltDel":
		// reboot=k makes the guest's reboot end Firecracker, as a power-off would.
		if err := v.pressPowerButton("reboot: Restarting system", "Ctrl-Alt-Del"); err != nil {
			fcFault(w, "%v", err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "FlushMetrics":
		w.WriteHeader(http.StatusNoContent)
	default:
		fcFault(w, "unknown variant `%s`, expected one of `FlushMetrics`, `InstanceStart`, `SendCtrlAltDel`", req.ActionType)
	}
}

func (v *fcVMM) instanceStart(w http.ResponseWriter) {
	v.mu.Lock()
	started := v.cfg != nil
	v.mu.Unlock()
	if started {
		fcFault(w, "The requested operation is not supported after starting the microVM.")
		return
	}
	v.fcMu.Lock()
	cfg := v.pending
	v.fcMu.Unlock()
	switch {
	case cfg.Payload == nil:
		fcFault(w, "Cannot start microvm that was not configured: missing kernel configuration.")
		return
	case cfg.CPUs.BootVCPUs == 0:
		fcFault(w, "Cannot start microvm that was not configured: missing machine configuration.")
		return
	}
	if err := v.boot(&cfg); err != nil {
		v.logger.Printf("InstanceStart: %v", err)
		fcFault(w, "Failed to start microVM: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (v *fcVMM) handleVMState(w http.ResponseWriter, r *http.Request) {
	var req struct {
		State string `json:"state"`
	}
	if !decodeFC(w, r, &req) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil {
		fcFault(w, "The requested operation is not supported before starting the microVM.")
		return
	}
	switch req.State {
	case "Paused":
		if v.state != stateRunning && v.state != statePaused {
			fcFault(w, "VM is %s", v.state)
			return
		}
		v.state = statePaused
	case "Resumed":
		if v.state == stateRunning {
			break
		}
		if err := v.resumeLocked(); err != nil {
			fcFault(w, "Failed to resume microVM: %v", err)
			return
		}
	default:
		fcFault(w, "unknown variant `%s`, expected `Paused` or `Resumed`", req.State)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fcSnapshot is the simulator's vmstate: the device configuration and what the guest keeps, the
// way Firecracker's vmstate holds device and vCPU state.
type fcSnapshot struct {
	Config VMConfig      `json:"config"`
	State  snapshotState `json:"state"`
	// VsockUDS is where the vsock device's socket was; empty without a vsock device.
	VsockUDS string `json:"vsock_uds,omitempty"`
}

// EncodeFCState is the vmstate of a paused VM with cfg whose guest named vmName has machineID,
// and whose vsock device, if any, listened on vsockUDS: for tools that write a snapshot without
// running its VM. The guest's network comes from cfg's kernel command line. guestClock, when not
// zero, is the guest's wall time at the capture.
func EncodeFCState(cfg VMConfig, vmName, machineID, vsockUDS string, guestClock time.Time) ([]byte, error) {
	st := snapshotState{VMName: vmName, State: statePaused, CPUs: cfg.CPUs.BootVCPUs, MachineID: machineID}
	if !guestClock.IsZero() {
		st.GuestClock = guestClock.UnixNano()
	}
	return json.Marshal(fcSnapshot{Config: cfg, State: st, VsockUDS: vsockUDS})
}

func (v *fcVMM) handleSnapshotCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		SnapshotType string `json:"snapshot_type,omitempty"`
		SnapshotPath string `json:"snapshot_path"`
		MemFilePath  string `json:"mem_file_path"`
	}
	if !decodeFC(w, r, &req) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg == nil || v.state != statePaused {
		fcFault(w, "Create snapshot error: the microVM must be paused.")
		return
	}
	st, err := v.guestState()
	if err != nil {
		fcFault(w, "Create snapshot error: %v", err)
		return
	}
	v.fcMu.Lock()
	vsockPath := v.vsockPath
	v.fcMu.Unlock()
	state, err := json.Marshal(fcSnapshot{Config: *v.cfg, State: st, VsockUDS: vsockPath})
	if err != nil {
		fcFault(w, "Create snapshot error: %v", err)
		return
	}
	if err := os.WriteFile(req.SnapshotPath, state, 0o600); err != nil {
		fcFault(w, "Create snapshot error: %v", err)
		return
	}
	if err := v.writeMemory(req.MemFilePath); err != nil {
		fcFault(w, "Create snapshot error: %v", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleSnapshotLoad brings a snapshot's VM up paused (or running with resume_vm). Its NICs keep
// the MACs they had: network_overrides changes only which TAP each one uses, and the guest keeps
// the network configuration it had.
func (v *fcVMM) handleSnapshotLoad(w http.ResponseWriter, r *http.Request) {
	var req struct {
		SnapshotPath string `json:"snapshot_path"`
		MemBackend   struct {
			BackendPath string `json:"backend_path"`
			BackendType string `json:"backend_type"`
		} `json:"mem_backend"`
		MemFilePath         string `json:"mem_file_path,omitempty"`
		EnableDiffSnapshots bool   `json:"enable_diff_snapshots,omitempty"`
		ResumeVM            bool   `json:"resume_vm,omitempty"`
		NetworkOverrides    []struct {
			IfaceID     string `json:"iface_id"`
			HostDevName string `json:"host_dev_name"`
		} `json:"network_overrides,omitempty"`
		VsockOverride *struct {
			UDSPath string `json:"uds_path"`
		} `json:"vsock_override,omitempty"`
	}
	if !decodeFC(w, r, &req) {
		return
	}
	v.mu.Lock()
	started := v.cfg != nil
	v.mu.Unlock()
	if started {
		fcFault(w, "Loading a microVM snapshot not allowed after configuring boot-specific resources.")
		return
	}
	data, err := os.ReadFile(req.SnapshotPath)
	if err != nil {
		fcFault(w, "Load snapshot error: Cannot open snapshot file: %v", err)
		return
	}
	var snap fcSnapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		fcFault(w, "Load snapshot error: Failed to restore from snapshot: %v", err)
		return
	}
	if _, err := os.Stat(req.MemBackend.BackendPath); err != nil {
		fcFault(w, "Load snapshot error: Cannot open the memory file: %v", err)
		return
	}
	cfg := snap.Config
	cfg.Nets = append([]Net(nil), cfg.Nets...)
	for _, o := range req.NetworkOverrides {
		found := false
		for i := range cfg.Nets {
			if cfg.Nets[i].ID == o.IfaceID {
				cfg.Nets[i].Tap, found = o.HostDevName, true
			}
		}
		if !found {
			fcFault(w, "Load snapshot error: Invalid network override: unknown interface %s", o.IfaceID)
			return
		}
	}
	udsPath := snap.VsockUDS
	if req.VsockOverride != nil {
		if udsPath == "" {
			fcFault(w, "Load snapshot error: vsock_override given, but the snapshot has no vsock device")
			return
		}
		udsPath = req.VsockOverride.UDSPath
	}
	if udsPath != "" {
		v.fcMu.Lock()
		err = v.openVsockLocked(udsPath)
		v.fcMu.Unlock()
		if err != nil {
			fcFault(w, "Load snapshot error: %v", err)
			return
		}
	}
	restored := restoredGuest{machineID: snap.State.MachineID, clock: snap.State.GuestClock}
	if snap.State.GuestNetwork != nil {
		restored.net = *snap.State.GuestNetwork
	} else if restored.net, err = networkFromBootArgs(&cfg, v.runDir); err != nil {
		fcFault(w, "Load snapshot error: %v", err)
		return
	}
	// A Uffd backend is a page-fault handler's socket, whose protocol the simulator does not
	// speak: such a guest comes back with an empty /dev/shm.
	if req.MemBackend.BackendType == "File" {
		if restored.ram, err = openMemoryFile(req.MemBackend.BackendPath); err != nil {
			fcFault(w, "Load snapshot error: Cannot open the memory file: %v", err)
			return
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.restoreLocked(&cfg, restored); err != nil {
		restored.ram.close()
		fcFault(w, "Load snapshot error: %v", err)
		return
	}
	if req.ResumeVM {
		if err := v.resumeLocked(); err != nil {
			fcFault(w, "Load snapshot error: %v", err)
			return
		}
	}
	v.logger.Printf("snapshot loaded from %s", req.SnapshotPath)
	w.WriteHeader(http.StatusNoContent)
}

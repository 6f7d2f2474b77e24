package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

// cocoon's Firecracker backend (hypervisor/firecracker, docs/cocoon-contract.md): the VM is
// configured over Firecracker's REST API rather than on its command line, its serial console is
// a PTY on Firecracker's stdio that a relay process serves on console.sock, a graceful stop is
// Ctrl-Alt-Del, and a clone loads the snapshot with new TAPs but keeps the snapshot's MACs.

// fcLogLevel is the log level cocoon starts Firecracker with.
const fcLogLevel = "Warning"

// fcArgs is Firecracker's command line: everything else goes through the API.
func (b *backend) fcArgs(rec *vmRecord) []string {
	return []string{"--api-sock", apiSocketPath(rec.RunDir), "--log-path", filepath.Join(rec.LogDir, b.kind.logFile), "--level", fcLogLevel, "--id", rec.ID}
}

func newFCClient(socketPath string) *chClient {
	c := newCHClient(socketPath)
	c.prefix = "/"
	return c
}

// fcIfaceID and fcDriveID are the device IDs cocoon gives Firecracker, by position.
func fcIfaceID(i int) string { return "eth" + strconv.Itoa(i) }
func fcDriveID(i int) string { return "drive_" + strconv.Itoa(i) }

// fcStart cold-boots a created or stopped VM: launch, then the configuration step by step, then
// InstanceStart. A failed step aborts the process.
func (b *backend) fcStart(ctx context.Context, rec *vmRecord) error {
	pid, err := b.launch(ctx, rec, b.fcArgs(rec))
	if err != nil {
		return err
	}
	if err := b.configureFC(ctx, newFCClient(apiSocketPath(rec.RunDir)), rec); err != nil {
		b.abortLaunch(ctx, pid, rec.RunDir)
		return fmt.Errorf("configure VM: %w", err)
	}
	return nil
}

// configureFC sends cocoon's cold-boot sequence.
func (b *backend) configureFC(ctx context.Context, fc *chClient, rec *vmRecord) error {
	step := func(name, endpoint string, body any, success ...int) error {
		if err := fc.action(ctx, endpoint, body, success...); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	cfg := rec.Config
	if err := step("machine-config", "machine-config", map[string]any{"vcpu_count": cfg.CPU, "mem_size_mib": cfg.Memory >> 20}); err != nil {
		return err
	}
	boot := rec.BootConfig
	if boot == nil || boot.KernelPath == "" {
		return errors.New("firecracker requires direct kernel boot (OCI image)")
	}
	if err := step("boot-source", "boot-source", map[string]any{"kernel_image_path": boot.KernelPath, "initrd_path": boot.InitrdPath, "boot_args": boot.Cmdline}); err != nil {
		return err
	}
	for i, sc := range rec.StorageConfigs {
		drive := map[string]any{"drive_id": fcDriveID(i), "path_on_host": sc.Path, "is_root_device": false, "is_read_only": sc.RO}
		if !sc.RO {
			drive["io_engine"] = "Async"
		}
		if err := step("drive "+fcDriveID(i), "drives/"+fcDriveID(i), drive); err != nil {
			return err
		}
	}
	for i, nc := range rec.NetworkConfigs {
		iface := map[string]any{"iface_id": fcIfaceID(i), "host_dev_name": nc.Tap, "guest_mac": nc.Mac}
		if err := step("network-interface "+fcIfaceID(i), "network-interfaces/"+fcIfaceID(i), iface); err != nil {
			return err
		}
	}
	if cfg.Memory >= minBalloonMemory {
		balloon := map[string]any{"amount_mib": (cfg.Memory / balloonDivisor) >> 20, "deflate_on_oom": true, "free_page_reporting": true}
		if err := step("balloon", "balloon", balloon); err != nil {
			return err
		}
	}
	if err := step("entropy", "entropy", map[string]any{}); err != nil {
		return err
	}
	if release.HasAgent() {
		if err := step("vsock", "vsock", map[string]any{"guest_cid": 3, "uds_path": filepath.Join(rec.RunDir, guest.VsockSocketName)}); err != nil {
			return err
		}
	}
	return step("instance-start", "actions", map[string]string{"action_type": "InstanceStart"}, http.StatusNoContent, http.StatusOK)
}

func fcCtrlAltDel(fc *chClient) func(context.Context) error {
	return func(ctx context.Context) error {
		return fc.action(ctx, "actions", map[string]string{"action_type": "SendCtrlAltDel"})
	}
}

func fcSetState(ctx context.Context, fc *chClient, state string) error {
	return fc.send(ctx, http.MethodPatch, "vm", map[string]string{"state": state})
}

// fcCloneFromSnapshot is cocoon's Firecracker clone once the snapshot files are in the clone's
// run dir: launch an empty Firecracker, load the snapshot with the clone's TAPs and vsock socket,
// resume, and move the drives to the clone's files. The guest keeps the snapshot's MACs.
func (b *backend) fcCloneFromSnapshot(ctx context.Context, vmID string, spec *vmSpec, nets []*cocoon.NetworkConfig, runDir, logDir string, now time.Time) (*cocoon.VM, error) {
	meta, err := loadSnapshotMeta(runDir)
	if err != nil {
		return nil, fmt.Errorf("load snapshot meta: %w", err)
	}
	for _, name := range []string{guest.FCStateFile, guest.FCMemoryFile} {
		if _, err := os.Stat(filepath.Join(runDir, name)); err != nil {
			return nil, fmt.Errorf("snapshot file %s missing: %w", name, err)
		}
	}
	if err := validateStorageConfigs(meta.StorageConfigs); err != nil {
		return nil, fmt.Errorf("sidecar invalid: %w", err)
	}
	snapshotPaths := make([]string, len(meta.StorageConfigs))
	storage := meta.StorageConfigs
	for i, sc := range storage {
		snapshotPaths[i] = sc.Path
		switch sc.Role {
		case cocoon.StorageRoleCOW:
			sc.Path = filepath.Join(runDir, cowRawFile)
		case cocoon.StorageRoleData:
			sc.Path = filepath.Join(runDir, dataDiskFileName(sc.Serial))
		case cocoon.StorageRoleCidata:
			return nil, fmt.Errorf("snapshot disk[%d] has cidata role; FC does not support cloudimg", i)
		}
	}
	boot := meta.BootConfig
	if err := verifyBaseFiles(storage, boot); err != nil {
		return nil, fmt.Errorf("verify base files: %w", err)
	}
	dns, err := b.conf.dnsServers()
	if err != nil {
		return nil, fmt.Errorf("parse DNS servers: %w", err)
	}
	boot.Cmdline = b.buildCmdline(storage, nets, spec.Name, dns)

	rec := &vmRecord{VM: cocoon.VM{ID: vmID, Config: spec.VMConfig, NetworkConfigs: nets}, RunDir: runDir, LogDir: logDir}
	pid, err := b.launch(ctx, rec, b.fcArgs(rec))
	if err != nil {
		b.markError(ctx, vmID)
		return nil, fmt.Errorf("launch FC: %w", err)
	}
	fc := newFCClient(apiSocketPath(runDir))
	if err := b.fcLoadClone(ctx, fc, runDir, nets, storage, snapshotPaths); err != nil {
		b.abortLaunch(ctx, pid, runDir)
		return nil, err
	}
	return b.recordClone(ctx, vmID, spec, nets, storage, boot, pid, runDir, now)
}

func (b *backend) fcLoadClone(ctx context.Context, fc *chClient, runDir string, nets []*cocoon.NetworkConfig, storage []*cocoon.StorageConfig, snapshotPaths []string) error {
	type override struct {
		IfaceID     string `json:"iface_id"`
		HostDevName string `json:"host_dev_name"`
	}
	load := map[string]any{
		"snapshot_path": filepath.Join(runDir, guest.FCStateFile),
		"mem_backend":   map[string]string{"backend_path": filepath.Join(runDir, guest.FCMemoryFile), "backend_type": "File"},
	}
	var overrides []override
	for i, nc := range nets {
		overrides = append(overrides, override{IfaceID: fcIfaceID(i), HostDevName: nc.Tap})
	}
	if len(overrides) > 0 {
		load["network_overrides"] = overrides
	}
	if release.HasAgent() {
		load["vsock_override"] = map[string]string{"uds_path": filepath.Join(runDir, guest.VsockSocketName)}
	}
	if err := fc.memoryTransfer(ctx, "snapshot/load", load); err != nil {
		return fmt.Errorf("snapshot/load: %w", err)
	}
	if err := fcSetState(ctx, fc, "Resumed"); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	for i, sc := range storage {
		if sc.Path == snapshotPaths[i] {
			continue
		}
		if err := fc.send(ctx, http.MethodPatch, "drives/"+fcDriveID(i), map[string]string{"drive_id": fcDriveID(i), "path_on_host": sc.Path}); err != nil {
			return fmt.Errorf("re-anchor drive %s: %w", fcDriveID(i), err)
		}
	}
	return nil
}

// Environment of cocoon's console relay: cocoon re-executes itself with exactly these two
// variables, the PTY master on fd 3 and the listening console.sock on fd 4.
const (
	consoleRelayEnv = "_COCOON_CONSOLE_RELAY"
	consoleRelayPID = "_COCOON_FC_PID"
	// relayPollInterval is how often the relay checks that Firecracker still runs.
	relayPollInterval = time.Second
)

// startConsoleRelay hands the console PTY's master to a relay process serving console.sock, so
// the console outlives this command. On failure the console is just unavailable, as with cocoon.
func (b *backend) startConsoleRelay(runDir string, fcPID int, master *os.File) {
	defer master.Close() //nolint:errcheck
	logger := b.log.with("firecracker.startConsoleRelay")
	if err := b.spawnConsoleRelay(runDir, fcPID, master); err != nil {
		logger.Warnf("console relay failed (console unavailable): %v", err)
	}
}

func (b *backend) spawnConsoleRelay(runDir string, fcPID int, master *os.File) error {
	sock := consoleSockPath(runDir)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", sock, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen %s: %w", sock, err)
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close() //nolint:errcheck
	lnFile, err := ln.File()
	if err != nil {
		return fmt.Errorf("listener fd: %w", err)
	}
	defer lnFile.Close() //nolint:errcheck
	self, err := os.Executable()
	if err != nil {
		return err
	}
	relay := &exec.Cmd{
		Path:        self,
		Args:        []string{self},
		Env:         []string{consoleRelayEnv + "=1", consoleRelayPID + "=" + strconv.Itoa(fcPID)},
		ExtraFiles:  []*os.File{master, lnFile},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := relay.Start(); err != nil {
		return err
	}
	go relay.Wait() //nolint:errcheck
	return nil
}

// runConsoleRelay is the relay process: one console session at a time, raw bytes both ways.
// Console output goes to the session's client, or nowhere while there is none; nothing is kept
// for a later client. It ends once Firecracker is gone, leaving console.sock behind.
func runConsoleRelay() int {
	fcPID, err := strconv.Atoi(os.Getenv(consoleRelayPID))
	if err != nil || fcPID <= 0 {
		return 1
	}
	master := os.NewFile(3, "console-pty")
	lnFile := os.NewFile(4, "console.sock")
	ln, err := net.FileListener(lnFile)
	_ = lnFile.Close()
	if err != nil {
		return 1
	}
	r := &consoleRelay{master: master}
	go r.pumpOutput()
	go func() {
		for range time.Tick(relayPollInterval) {
			if err := unix.Kill(fcPID, 0); errors.Is(err, unix.ESRCH) {
				_ = ln.Close()
				r.endSession()
				return
			}
		}
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return 0
		}
		r.serve(conn)
	}
}

type consoleRelay struct {
	master *os.File
	mu     sync.Mutex
	conn   net.Conn // the session's client; nil between sessions
}

func (r *consoleRelay) pumpOutput() {
	buf := make([]byte, 4096)
	for {
		n, err := r.master.Read(buf)
		if n > 0 {
			r.mu.Lock()
			if r.conn != nil {
				_, _ = r.conn.Write(buf[:n])
			}
			r.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// serve runs one session: the client's bytes go to the guest until it hangs up.
func (r *consoleRelay) serve(conn net.Conn) {
	r.mu.Lock()
	r.conn = conn
	r.mu.Unlock()
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if _, werr := r.master.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	r.endSession()
}

func (r *consoleRelay) endSession() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
	}
}

// fcCmdlineHead is the start of cocoon's Firecracker kernel command line: the serial console,
// a reboot that ends Firecracker, and disks named by position (Firecracker has no virtio-blk
// serials).
const fcCmdlineHead = "console=ttyS0 reboot=k loglevel=3 i8042.noaux 8250.nr_uarts=1"

// fcDiskNames are the guest's names for the layers (top-most first) and the COW disk.
func fcDiskNames(storage []*cocoon.StorageConfig) (layers []string, cow string) {
	for i, sc := range storage {
		name := "/dev/vd" + string(rune('a'+i))
		switch sc.Role {
		case cocoon.StorageRoleLayer:
			layers = append([]string{name}, layers...)
		case cocoon.StorageRoleCOW:
			cow = name
		}
	}
	return layers, cow
}

// isFCRelay reports whether this process was started as cocoon's console relay.
func isFCRelay() bool { return os.Getenv(consoleRelayEnv) == "1" }

package guest

import (
	"errors"
	"fmt"
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

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

// Cloud Hypervisor VM states as vm.info reports them.
const (
	stateCreated  = "Created"
	stateRunning  = "Running"
	statePaused   = "Paused"
	stateShutdown = "Shutdown"
)

// flushOnExit is how long a guest that powers off waits for its last console lines to be read.
const flushOnExit = time.Second

// vmm is one simulated hypervisor process and the guest inside it.
type vmm struct {
	name   string
	runDir string
	spec   Spec
	logger *log.Logger
	exit   chan int
	booted time.Time

	mu    sync.Mutex
	cfg   *VMConfig // nil until the VM is booted or restored
	state string
	// resumePending is set by vm.restore: the guest comes back on the first vm.resume, with the
	// network state restoredNet, the machine-id restoredMachineID and the RAM restoredRAM it had
	// when the snapshot was taken.
	resumePending     bool
	restoredNet       guestNetwork
	restoredMachineID string
	// restoredClock is the guest's wall time (Unix nanoseconds) when the restored snapshot was
	// taken, 0 when it records none: the restored guest's clock goes on from there.
	restoredClock int64
	// noRTC: the VM has no real-time clock device (Firecracker on x86_64).
	noRTC       bool
	restoredRAM *restoredRAM // the snapshot's memory file until the first resume; nil without one
	console     *console
	nics        map[string]*nic      // open virtio-net devices by ID
	os          guestOS              // nil while no guest runs
	diskDevs    map[string]string    // guest device names of hot-plugged disks, by device ID
	vfioGroups  map[string]*os.File  // IOMMU groups held for passed-through devices, by group
	fsDevs      map[string]*fsDevice // virtio-fs devices by ID
	fsMounts    *net.UnixListener    // where the guest asks to mount a virtio-fs tag; nil until a device is added
	load        *guestLoad           // what the running guest costs the process; nil with none or a real kernel
}

// runVMM is the hypervisor process: it parses cloud-hypervisor arguments, boots the VM when they
// describe one (otherwise it waits for vm.restore), serves the API and runs until the guest powers
// off, the API shuts it down and a signal arrives, or it crashes.
func runVMM(name string, args []string) int {
	logger := log.New(os.Stderr, "cloud-hypervisor(sim): ", log.LstdFlags|log.Lmicroseconds)
	apiSocket, cfg, err := ParseArgs(args)
	if err != nil {
		logger.Printf("invalid arguments: %v", err)
		return 1
	}
	v := &vmm{
		name:   name,
		runDir: filepath.Dir(apiSocket),
		logger: logger,
		exit:   make(chan int, 1),
		booted: time.Now(),
		state:  stateCreated,
		nics:   map[string]*nic{},
	}
	if v.spec, err = ReadSpec(v.runDir); err != nil {
		logger.Printf("guest behaviour: %v", err)
		return 1
	}
	if v.spec.FailBoot {
		logger.Printf("Error booting VM: simulated boot failure (%s: fail_boot)", SpecFile)
		return 1
	}
	if release.HasAgent() {
		vsock, err := v.listenVsock(filepath.Join(v.runDir, VsockSocketName))
		if err != nil {
			logger.Printf("vsock: %v", err)
			return 1
		}
		defer vsock.Close() //nolint:errcheck // also removes the socket file
	}
	if cfg != nil {
		if err := v.boot(cfg); err != nil {
			logger.Printf("Error booting VM: %v", err)
			return 1
		}
	}

	if err := os.Remove(apiSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
		logger.Printf("remove stale api socket: %v", err)
		return 1
	}
	ln, err := net.Listen("unix", apiSocket)
	if err != nil {
		logger.Printf("listen %s: %v", apiSocket, err)
		return 1
	}
	go func() { _ = http.Serve(ln, v.routes()) }() //nolint:gosec // unix socket, local only
	logger.Printf("API server listening on %s (pid %d)", apiSocket, os.Getpid())

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

// boot brings up a VM from its configuration: console first (vm.info must report it as soon as
// the API answers), then the NICs' TAPs, then the guest OS on them, then the behaviours.
func (v *vmm) boot(cfg *VMConfig) error {
	if err := v.attachConsole(cfg); err != nil {
		return err
	}
	nics, err := v.openNICs(cfg)
	if err != nil {
		return err
	}
	guestOS, err := v.bootGuestOS(cfg, nics)
	if err != nil {
		v.closeNICs()
		return err
	}
	v.mu.Lock()
	v.cfg = cfg
	v.state = stateRunning
	v.os = guestOS
	err = v.startLoad()
	v.mu.Unlock()
	if err != nil {
		return err
	}
	v.startBehaviours()
	return nil
}

// startLoad puts the simulated guest's memory and vCPU into this process (a real kernel runs in
// QEMU, which is its own load). The caller holds v.mu.
func (v *vmm) startLoad() error {
	switch v.os.(type) {
	case *qemuOS, nullOS: // a real kernel is its own load; the benchmark's null guest has none
		return nil
	}
	if v.load != nil {
		return nil
	}
	load, err := startGuestLoad(v.cfg.Memory.Size, func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.state == stateRunning
	})
	if err != nil {
		return err
	}
	v.load = load
	return nil
}

// stopGuest ends the guest OS and closes the NICs, as a VM that shuts down releases its
// devices. The caller holds v.mu.
func (v *vmm) stopGuest() {
	v.console.acceptInput(false)
	if v.os != nil {
		v.os.stop()
		v.os, v.diskDevs = nil, nil
	}
	v.restoredRAM.close()
	v.restoredRAM = nil
	v.closeVFIOGroups()
	v.closeFsDevices()
	if v.load != nil {
		v.load.close()
		v.load = nil
	}
	v.closeNICs()
}

// attachConsole opens the device the configuration asks for: the virtio-console PTY (direct
// boot), the serial socket (UEFI) or, under Firecracker, the serial port on the process's tty. The guest prints to whichever is its console.
func (v *vmm) attachConsole(cfg *VMConfig) error {
	c := newConsole()
	switch {
	case cfg.Console != nil && cfg.Console.Mode == ModePty:
		p, err := openPTY(c.typed)
		if err != nil {
			return err
		}
		cfg.Console.File = p.path
		c.run(p)
	case cfg.Serial != nil && cfg.Serial.Mode == ModeTty:
		if err := control(os.Stdin, makeRaw); err != nil {
			return fmt.Errorf("raw mode on the serial tty: %w", err)
		}
		go readTyped(os.Stdin, c.typed)
		c.run(os.Stdout)
	case cfg.Serial != nil && cfg.Serial.Mode == ModeSocket:
		s, err := listenSerial(cfg.Serial.Socket, c.typed)
		if err != nil {
			return err
		}
		c.run(s)
	default:
		c.run(nil)
	}
	v.console = c
	return nil
}

func (v *vmm) printBanner(cfg *VMConfig) {
	c := v.console
	c.Printf("[    0.000000] Linux version 6.1.0-cocoon-sim (cocoon-sim@localhost) #1 SMP PREEMPT_DYNAMIC")
	if cfg.Payload != nil && cfg.Payload.Cmdline != "" {
		c.Printf("[    0.000000] Command line: %s", cfg.Payload.Cmdline)
	}
	c.Printf("[    0.004000] Memory: %dK/%dK available", cfg.Memory.Size>>10, cfg.Memory.Size>>10)
	c.Printf("[    0.012000] smp: Brought up 1 node, %d CPUs", max(cfg.CPUs.BootVCPUs, 1))
	for i, d := range cfg.Disks {
		c.Printf("[    0.120000] virtio_blk virtio%d: [vd%c] %s", i+1, 'a'+rune(i%26), filepath.Base(d.Path))
	}
	c.Printf("[    0.500000] Run /sbin/init as init process")
}

func (v *vmm) printReady() {
	v.console.Printf("cocoon-sim guest %s ready", v.name)
}

// uptime is the kernel-style timestamp of a console line.
func (v *vmm) uptime() string {
	return fmt.Sprintf("[%12.6f]", time.Since(v.booted).Seconds())
}

// powerOff is a clean guest shutdown: the last console lines, then the hypervisor exits 0.
func (v *vmm) powerOff(reason string) {
	v.console.Printf("%s reboot: Power down", v.uptime())
	v.console.Flush(flushOnExit)
	v.logger.Printf("guest powered off (%s)", reason)
	v.requestExit(0)
}

// crash kills the hypervisor without any cleanup, like a fatal fault would.
func (v *vmm) crash(reason string) {
	v.logger.Printf("fatal: %s", reason)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

func (v *vmm) requestExit(code int) {
	select {
	case v.exit <- code:
	default:
	}
}

// startBehaviours arms the image's timed behaviours once the guest runs.
func (v *vmm) startBehaviours() {
	if d := time.Duration(v.spec.PoweroffAfter); d > 0 {
		time.AfterFunc(d, func() { v.powerOff(fmt.Sprintf("poweroff_after %s", d)) })
	}
	if d := time.Duration(v.spec.CrashAfter); d > 0 {
		time.AfterFunc(d, func() { v.crash(fmt.Sprintf("crash_after %s", d)) })
	}
}

// watchMemoryFiles stands in for UFFD on-demand restore: guest memory keeps being paged in from
// the snapshot's memory files, so when one vanishes the next page fault kills the hypervisor.
func (v *vmm) watchMemoryFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var files []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "memory-range") {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	go func() {
		for range time.Tick(100 * time.Millisecond) {
			for _, f := range files {
				if _, err := os.Stat(f); err != nil {
					v.crash(fmt.Sprintf("UFFD: cannot serve page fault from %s: %v", f, err))
				}
			}
		}
	}()
	return nil
}

// Package qemu runs a direct-boot guest under QEMU's software emulation (TCG) in place of
// cloud-hypervisor, for the simulator's VMs whose kernel is a real one. This host cannot run
// nested KVM guests, so nothing here uses KVM.
//
// The guest sees what cloud-hypervisor gives a cocoon direct-boot VM where it matters to tests:
// the kernel, initramfs and command line as given, a virtio-net NIC per TAP with the given MAC
// (an existing TAP, vnet_hdr on, no scripts), and a virtio console (hvc0, cocoon's console=hvc0).
// A 16550 serial port (ttyS0) shares the console sink, so a command line that names it shows the
// kernel's messages from the first line.
//
// The machine is q35 with virtio-pci devices, as cloud-hypervisor's are. Under TCG it boots as
// fast as microvm (about 3 s to a ready guest here, either way), and microvm cannot be trusted:
// it has no HPET and no ACPI PM timer, so when calibrating the TSC against the PIT fails, which
// under emulation it sometimes does, the guest kernel has no reference clock and hangs in early
// boot. q35 falls back to the HPET.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/cocoonstack/cocoon-cri/pkg/syncio"
)

// DefaultBinary is the QEMU that runs the guest, looked up in PATH.
const DefaultBinary = "qemu-system-x86_64"

const (
	defaultVCPUs     = 1
	defaultMemoryMiB = 512
	// stderrTail bounds how much of QEMU's stderr is kept for error messages.
	stderrTail = 4 << 10
)

// Config describes one VM.
type Config struct {
	// Binary is the QEMU executable; empty means DefaultBinary.
	Binary string
	// Kernel is the bzImage to boot; Initrd, if set, its initramfs; Cmdline its command line.
	Kernel  string
	Initrd  string
	Cmdline string
	// VCPUs and MemoryMiB size the VM; zero means 1 vCPU and 512 MiB.
	VCPUs     int
	MemoryMiB int
	// NICs are the guest's network interfaces, eth0 first.
	NICs []NIC
	// Console receives the guest's console output (hvc0 and ttyS0): a PTY master or any writer.
	// An *os.File is handed to QEMU as is; another writer is fed through a pipe and must not
	// block. Nil discards the output.
	Console io.Writer
}

// NIC is one guest network interface.
type NIC struct {
	// TAP names an existing TAP device in the network namespace of the thread that calls Run,
	// made with IFF_VNET_HDR and IFF_NO_PI as cocoon makes it. QEMU opens it; it creates nothing.
	TAP string
	// MAC is the guest's address, "02:00:00:00:00:01".
	MAC string
}

// Run starts the VM and returns once QEMU answers on its control socket, i.e. once the guest's
// devices exist and it is booting. ctx bounds only the start; the VM runs until it powers off or
// is killed.
//
// QEMU runs in the network namespace of the calling thread: lock the goroutine to its thread and
// switch that thread's namespace around the call. QEMU is killed when that thread ends (its parent
// death signal), so a VM never outlives the code that started it: unlock the thread only after
// switching it back, never let a goroutine end while locked to a thread that started a VM.
func Run(ctx context.Context, cfg Config) (*Process, error) {
	if cfg.Kernel == "" {
		return nil, errors.New("qemu: no kernel")
	}
	binary := cfg.Binary
	if binary == "" {
		binary = DefaultBinary
	}
	// QEMU's control socket lives in a private directory that goes when QEMU does.
	dir, err := os.MkdirTemp("", "qemu-")
	if err != nil {
		return nil, fmt.Errorf("qemu: create socket dir: %w", err)
	}
	qmpSock := filepath.Join(dir, "qmp.sock")
	stderr := &syncio.Tail{Max: stderrTail}
	cmd := exec.Command(binary, args(cfg, qmpSock)...)
	cmd.Stdout = cfg.Console
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("qemu: start %s: %w", binary, err)
	}
	p := &Process{cmd: cmd, qmpSock: qmpSock, stderr: stderr, done: make(chan struct{})}
	go p.wait(dir)

	if err := p.awaitControl(ctx); err != nil {
		_ = p.Kill()
		return nil, err
	}
	return p, nil
}

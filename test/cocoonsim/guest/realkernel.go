package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/qemu"
)

// bzImageMagic is the Linux boot protocol's setup header signature, at bzImageMagicOffset.
const bzImageMagicOffset = 0x202

var bzImageMagic = []byte("HdrS")

// qemuStartTimeout bounds QEMU's start-up (not the guest's boot).
const qemuStartTimeout = 30 * time.Second

// isBzImage reports whether path is a real Linux kernel rather than a test placeholder.
func isBzImage(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, len(bzImageMagic))
	if _, err := f.ReadAt(magic, bzImageMagicOffset); err != nil {
		return false
	}
	return bytes.Equal(magic, bzImageMagic)
}

// qemuOS is a real kernel running under QEMU on the VM's TAPs. The hypervisor process lives as
// long as the guest does: a guest that powers off ends it, as cloud-hypervisor ends.
type qemuOS struct {
	proc     *qemu.Process
	net      guestNetwork
	stopping chan struct{}
}

// startQEMU hands the VM's TAPs to QEMU: their queues are closed here first, because a TAP made
// with one queue takes one opener, and QEMU opens it by name.
func (v *vmm) startQEMU(cfg *VMConfig, nics []*nic, netState guestNetwork) (guestOS, error) {
	qc := qemu.Config{
		Kernel:    cfg.Payload.Kernel,
		Initrd:    cfg.Payload.Initramfs,
		Cmdline:   cfg.Payload.Cmdline,
		VCPUs:     max(cfg.CPUs.BootVCPUs, 1),
		MemoryMiB: int(cfg.Memory.Size >> 20),
		Console:   consoleWriter{v.console},
	}
	for _, dev := range nics {
		dev.close()
		qc.NICs = append(qc.NICs, qemu.NIC{TAP: dev.net.Tap, MAC: dev.net.Mac})
	}
	ctx, cancel := context.WithTimeout(context.Background(), qemuStartTimeout)
	defer cancel()
	proc, err := qemu.Run(ctx, qc)
	if err != nil {
		return nil, fmt.Errorf("boot the real kernel under QEMU: %w", err)
	}
	v.logger.Printf("real kernel %s booting under QEMU (pid %d)", cfg.Payload.Kernel, proc.PID())
	q := &qemuOS{proc: proc, net: netState, stopping: make(chan struct{})}
	go func() {
		select {
		case <-proc.Done():
			v.logger.Printf("QEMU exited: %v", proc.Wait())
			v.requestExit(0)
		case <-q.stopping:
		}
	}()
	return q, nil
}

func (q *qemuOS) plug(*nic) error {
	return errors.New("cocoon-sim: NIC hot-plug is not simulated for a real kernel")
}

func (q *qemuOS) unplug(string) {}

// A real kernel under QEMU gets no hot-plugged disk: the simulator cannot reach its devices.
func (q *qemuOS) plugDisk(Disk) (string, error) {
	return "", errors.New("a real-kernel guest takes no hot-plugged disk in the simulator")
}
func (q *qemuOS) unplugDisk(string, string) error { return nil }

func (q *qemuOS) network() (guestNetwork, error) { return q.net, nil }

// stop ends the guest at once (vm.shutdown, or the VM going away); the hypervisor process goes on.
func (q *qemuOS) stop() {
	close(q.stopping)
	_ = q.proc.Kill()
}

// pressPowerButton asks the real guest to power off through ACPI; its exit ends the hypervisor.
func (q *qemuOS) pressPowerButton() {
	ctx, cancel := context.WithTimeout(context.Background(), qemuStartTimeout)
	defer cancel()
	_ = q.proc.PowerOff(ctx)
}

// consoleWriter feeds QEMU's console output into the VM's console device, which never blocks.
type consoleWriter struct{ c *console }

func (w consoleWriter) Write(p []byte) (int, error) {
	w.c.write(bytes.Clone(p))
	return len(p), nil
}

var _ io.Writer = consoleWriter{}

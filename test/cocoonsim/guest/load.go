package guest

import (
	"os"
	"syscall"
	"time"
)

// guestLoad is what a running guest costs its hypervisor process. Under cloud-hypervisor the
// guest's RAM is the process's own anonymous memory, faulted in as the guest first touches it, and
// the guest's vCPUs are the process's threads; so the hypervisor's /proc/<pid> is the VM's usage,
// which is what cocoon-cri reports. The simulated guest OS is a separate process and costs the
// hypervisor nothing, so this stands in for it: guest RAM mapped at the VM's size and touched
// lazily up to a bound, and a vCPU kept a little busy while the VM runs (an idle Linux guest's
// timer ticks and housekeeping). A real guest touches more; the bound keeps many simulated VMs
// on a test machine.
type guestLoad struct {
	mem     []byte
	stop    chan struct{}
	running func() bool
}

const (
	loadTick = 100 * time.Millisecond
	// loadBusy is the vCPU time one tick takes: about 1% of a core.
	loadBusy = time.Millisecond
	// The guest touches loadBoot at once (kernel and init), then loadGrow a tick, up to 1/32 of its
	// RAM and at most loadMax.
	loadBoot = 4 << 20
	loadGrow = 1 << 20
	loadMax  = 32 << 20
)

// startGuestLoad maps the guest's RAM and runs its vCPU while running says the VM runs. A VM
// that cannot map its RAM does not boot, as with cloud-hypervisor.
func startGuestLoad(memSize int64, running func() bool) (*guestLoad, error) {
	if memSize <= 0 {
		memSize = 512 << 20
	}
	// MAP_NORESERVE: like a guest's RAM, it takes memory only where touched.
	mem, err := syscall.Mmap(-1, 0, int(memSize), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return nil, os.NewSyscallError("mmap guest memory", err)
	}
	l := &guestLoad{mem: mem, stop: make(chan struct{}), running: running}
	go l.run()
	return l, nil
}

// close stops the vCPU; the guest's RAM is unmapped once the vCPU has let go of it. It does not
// wait, so callers may hold the lock running takes.
func (l *guestLoad) close() { close(l.stop) }

func (l *guestLoad) run() {
	defer func() { _ = syscall.Munmap(l.mem) }()
	resident := min(len(l.mem)/32, loadMax)
	touched := l.touch(0, min(loadBoot, resident))
	tick := time.NewTicker(loadTick)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		if !l.running() {
			continue // paused: vCPUs do not run
		}
		touched = l.touch(touched, min(touched+loadGrow, resident))
		l.spin(touched)
	}
}

// touch writes a byte in every page of [from, to), which faults it in.
func (l *guestLoad) touch(from, to int) int {
	page := os.Getpagesize()
	for off := from; off < to; off += page {
		l.mem[off]++
	}
	return max(from, to)
}

// spin keeps the vCPU busy for loadBusy reading the guest's resident memory.
func (l *guestLoad) spin(resident int) {
	if resident == 0 {
		return
	}
	page := os.Getpagesize()
	deadline := time.Now().Add(loadBusy)
	var sum byte
	for off := 0; time.Now().Before(deadline); off = (off + page) % resident {
		sum += l.mem[off]
	}
	l.mem[0] = sum
}

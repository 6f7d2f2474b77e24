// Package realguest builds a real Linux guest for end-to-end network tests: a Debian kernel and a
// busybox initramfs whose /init configures its NIC from cocoon's direct-boot kernel arguments
// (ip=, cocoon.hostname=), answers TCP connections on ServicePort with one line naming itself,
// and prints ReadyMarker on its console. hack/setup-realguest.sh installs what it is built from.
package realguest

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

const (
	// KernelRoot is where hack/setup-realguest.sh unpacks the Debian kernel (boot/vmlinuz-*,
	// lib/modules/*); keep the two in sync.
	KernelRoot = "/var/cache/cocoon-cri/realguest"
	// Busybox is busybox-static's binary; the initramfs has no libc, so it must be static.
	Busybox = "/bin/busybox"
	// ServicePort is the guest's TCP port; each connection gets "<hostname> <ip>\n".
	ServicePort = 8080
)

// What the guest says on its console, each at the start of a line.
const (
	// ReadyMarker: "realguest ready <hostname> <ip>", once its network and service are up.
	ReadyMarker = "realguest ready"
	// FailedMarker: "realguest failed: <why>", after which it powers off.
	FailedMarker = "realguest failed:"
	// NameserversMarker: "realguest: nameservers <dns0> <dns1>", the resolv.conf it wrote.
	NameserversMarker = "realguest: nameservers"
	// PowerOffMarker: the ACPI power button was pressed and it is powering off.
	PowerOffMarker = "realguest: power button, powering off"
)

// Cmdline is the base kernel command line, before the network arguments (IPArgs). It keeps
// cocoon's direct-boot console (console=hvc0, cloud-hypervisor's virtio console) and names the
// serial port first, so the kernel's own messages are seen before virtio_console loads; the last
// console= is the one /init writes to. panic=-1 reboots a guest whose /init dies, which ends a
// QEMU run with -no-reboot instead of hanging.
const Cmdline = "console=ttyS0 console=hvc0 loglevel=3 net.ifnames=0 panic=-1"

// ErrNotInstalled means something hack/setup-realguest.sh installs is missing.
var ErrNotInstalled = errors.New("not installed (run hack/setup-realguest.sh as root)")

// Guest is a bootable guest: a kernel and the initramfs built for it.
type Guest struct {
	Kernel        string // the vmlinuz
	Initrd        string // gzip'd newc cpio
	KernelVersion string
}

// Build writes the initramfs under dir for the newest kernel under KernelRoot.
func Build(dir string) (*Guest, error) {
	k, err := findKernel(KernelRoot)
	if err != nil {
		return nil, err
	}
	if err := checkStatic(Busybox); err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "initramfs-"+k.version+".img")
	if err := writeInitramfs(initrd, Busybox, k); err != nil {
		return nil, err
	}
	return &Guest{Kernel: k.image, Initrd: initrd, KernelVersion: k.version}, nil
}

// checkStatic fails unless path is a statically linked executable: a dynamic busybox (Debian's
// "busybox" package) would die in the initramfs for want of a loader.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: busybox-static %w", path, ErrNotInstalled)
		}
		return fmt.Errorf("inspect %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: busybox-static %w", path, ErrNotInstalled)
		}
	}
	return nil
}

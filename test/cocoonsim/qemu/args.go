package qemu

import (
	"fmt"
	"strconv"
	"strings"
)

// args is QEMU's command line for cfg, its QMP socket at qmpSock.
func args(cfg Config, qmpSock string) []string {
	vcpus, mem := cfg.VCPUs, cfg.MemoryMiB
	if vcpus <= 0 {
		vcpus = defaultVCPUs
	}
	if mem <= 0 {
		mem = defaultMemoryMiB
	}
	a := []string{
		"-machine", "q35",
		"-accel", "tcg",
		"-smp", strconv.Itoa(vcpus),
		"-m", strconv.Itoa(mem) + "M",
		// Only the devices listed here: no default NIC, VGA, monitor or serial; no config files.
		"-nodefaults", "-no-user-config", "-display", "none",
		// A guest reboot ends QEMU as a power-off does; with panic=-1 so does a kernel panic.
		"-no-reboot",
		"-kernel", cfg.Kernel,
		"-append", cfg.Cmdline,
		// One sink for both consoles: mux lets two devices write to the same stdio backend.
		// signal=off: a ^C typed into a console is the guest's, not a reason for QEMU to quit.
		"-chardev", "stdio,id=console,mux=on,signal=off",
		"-serial", "chardev:console",
		"-device", "virtio-serial-pci",
		"-device", "virtconsole,chardev=console",
		"-qmp", "unix:" + qmpOptionValue(qmpSock) + ",server=on,wait=off",
	}
	if cfg.Initrd != "" {
		a = append(a, "-initrd", cfg.Initrd)
	}
	for i, nic := range cfg.NICs {
		id := fmt.Sprintf("net%d", i)
		// An existing TAP, opened with its vnet header as cloud-hypervisor opens it; no
		// ifup/ifdown scripts, since the caller has wired the TAP already. No option ROM: the
		// kernel is loaded directly, nothing boots from the network.
		a = append(a,
			"-netdev", "tap,id="+id+",ifname="+nic.TAP+",script=no,downscript=no,vnet_hdr=on",
			"-device", "virtio-net-pci,netdev="+id+",mac="+nic.MAC+",romfile=",
		)
	}
	return a
}

// qmpOptionValue escapes a path for a QEMU option list, where a comma separates options unless
// doubled.
func qmpOptionValue(path string) string { return strings.ReplaceAll(path, ",", ",,") }

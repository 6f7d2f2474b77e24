package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	cns "github.com/containernetworking/plugins/pkg/ns"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

const (
	defaultDiskQueueSize = 512
	minBalloonMemory     = 256 << 20
	balloonDivisor       = 4
)

// buildVMConfig is the cloud-hypervisor configuration cocoon derives from a record for a cold
// boot: a PTY console for direct boot, the serial socket for UEFI.
func (b *backend) buildVMConfig(rec *vmRecord) *guest.VMConfig {
	cfg := &guest.VMConfig{
		CPUs:     guest.CPUs{BootVCPUs: rec.Config.CPU, MaxVCPUs: runtime.NumCPU(), KVMHyperV: rec.Config.Windows},
		Memory:   guest.Memory{Size: rec.Config.Memory, Shared: rec.Config.SharedMemory},
		RNG:      guest.RNG{Src: "/dev/urandom"},
		Watchdog: true,
	}
	if rec.BootConfig.directBoot() {
		cfg.Serial = &guest.RuntimeFile{Mode: guest.ModeOff}
		cfg.Console = &guest.RuntimeFile{Mode: guest.ModePty}
	} else {
		cfg.Serial = &guest.RuntimeFile{Mode: guest.ModeSocket, Socket: consoleSockPath(rec.RunDir)}
		cfg.Console = &guest.RuntimeFile{Mode: guest.ModeOff}
	}
	if rec.Config.Memory >= minBalloonMemory && !rec.Config.Windows {
		cfg.Balloon = &guest.Balloon{Size: rec.Config.Memory / balloonDivisor, DeflateOnOOM: true, FreePageReporting: true}
	}
	skipCidata := rec.FirstBooted && !rec.BootConfig.directBoot()
	for _, sc := range rec.StorageConfigs {
		if skipCidata && sc.Role == cocoon.StorageRoleCidata {
			continue
		}
		cfg.Disks = append(cfg.Disks, storageConfigToDisk(sc, rec.Config.CPU, rec.Config.DiskQueueSize, rec.Config.NoDirectIO))
	}
	for _, nc := range rec.NetworkConfigs {
		cfg.Nets = append(cfg.Nets, networkConfigToNet(nc))
	}
	switch boot := rec.BootConfig; {
	case boot.directBoot():
		cfg.Payload = &guest.Payload{Kernel: boot.KernelPath, Initramfs: boot.InitrdPath, Cmdline: boot.Cmdline}
	case boot != nil && boot.FirmwarePath != "":
		cfg.Payload = &guest.Payload{Firmware: boot.FirmwarePath}
	}
	return cfg
}

// networkConfigToNet is the virtio-net device cocoon gives cloud-hypervisor for a NIC.
func networkConfigToNet(nc *cocoon.NetworkConfig) guest.Net {
	return guest.Net{Tap: nc.Tap, Mac: nc.Mac, NumQueues: nc.NumQueues, QueueSize: nc.QueueSize, OffloadTSO: true, OffloadUFO: true, OffloadCsum: true}
}

func storageConfigToDisk(sc *cocoon.StorageConfig, cpu, diskQueueSize int, noDirectIO bool) guest.Disk {
	if diskQueueSize <= 0 {
		diskQueueSize = defaultDiskQueueSize
	}
	d := guest.Disk{Path: sc.Path, ReadOnly: sc.RO, Serial: sc.Serial, NumQueues: cpu, QueueSize: diskQueueSize}
	if sc.DirectIO != nil {
		d.DirectIO = *sc.DirectIO
	} else {
		d.DirectIO = !sc.RO && !noDirectIO
	}
	switch {
	case filepath.Ext(sc.Path) == ".qcow2":
		d.ImageType, d.BackingFiles = "Qcow2", !sc.RO
	case sc.RO:
		d.ImageType = "Raw"
	default:
		d.ImageType, d.Sparse = "Raw", true
	}
	return d
}

// launch starts the hypervisor process for rec with args, records its PID and waits for its API
// socket, like cocoon's launchProcess. The process log is recreated on every launch:
// cloud-hypervisor writes to it on stdout and stderr, Firecracker opens it by path (--log-path)
// and gets a PTY for stdio, its serial console, which a relay then serves on console.sock.
func (b *backend) launch(ctx context.Context, rec *vmRecord, args []string) (int, error) {
	opts := guest.LaunchOptions{Binary: b.conf.CHBinary, Args: args, VMName: rec.Config.Name, PIDFile: b.pidFilePath(rec.RunDir)}
	logFile, err := os.Create(filepath.Join(rec.LogDir, b.kind.logFile)) //nolint:gosec // VM log dir
	if err != nil {
		b.log.with(b.kind.typ+".launchProcess").Warnf("create process log: %v", err)
	} else {
		defer logFile.Close() //nolint:errcheck
		opts.Log = logFile
	}
	var consoleMaster *os.File
	if b.kind == kindFC {
		master, slave, err := guest.OpenPTYPair()
		if err != nil {
			return 0, fmt.Errorf("allocate console PTY: %w", err)
		}
		defer slave.Close() //nolint:errcheck
		opts.Binary, opts.Serial, consoleMaster = b.conf.FCBinary, slave, master
	}
	pid, err := launchInVMNetns(rec.NetworkConfigs, opts)
	if err != nil {
		if consoleMaster != nil {
			_ = consoleMaster.Close()
		}
		return 0, err
	}
	pidPath := b.pidFilePath(rec.RunDir)
	if err := writePIDFile(pidPath, pid); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return 0, fmt.Errorf("write PID file: %w", err)
	}
	timeout := time.Duration(b.conf.socketWaitTimeoutSeconds()) * time.Second
	if err := waitForSocket(ctx, apiSocketPath(rec.RunDir), pid, timeout, b.binaryName()); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = os.Remove(pidPath)
		if consoleMaster != nil {
			_ = consoleMaster.Close()
		}
		return 0, err
	}
	if consoleMaster != nil {
		b.startConsoleRelay(rec.RunDir, pid, consoleMaster)
	}
	return pid, nil
}

// launchInVMNetns starts the hypervisor where its TAPs are: in CNI mode inside the VM's netns
// (cocoon enters it before the fork, so the process and the guest it runs live there), in bridge
// mode and without NICs in the caller's own namespace.
func launchInVMNetns(nets []*cocoon.NetworkConfig, opts guest.LaunchOptions) (int, error) {
	launch := func() (int, error) {
		pid, err := guest.Launch(opts)
		if err != nil {
			return 0, fmt.Errorf("exec %s: %w", filepath.Base(opts.Binary), err)
		}
		return pid, nil
	}
	if len(nets) == 0 || nets[0].NetnsPath == "" {
		return launch()
	}
	vmNetns, err := cns.GetNS(nets[0].NetnsPath)
	if err != nil {
		return 0, fmt.Errorf("enter netns: %w", err)
	}
	defer vmNetns.Close() //nolint:errcheck
	var pid int
	err = vmNetns.Do(func(cns.NetNS) error {
		var err error
		pid, err = launch()
		return err
	})
	return pid, err
}

// saveCmdline records the hypervisor command line in the run dir, as cocoon does for debugging.
func (b *backend) saveCmdline(runDir string, args []string) {
	line := b.conf.CHBinary + " " + strings.Join(args, " ")
	if err := os.WriteFile(filepath.Join(runDir, cmdlineFileName), []byte(line), 0o600); err != nil {
		b.log.with("cloudhypervisor.saveCmdline").Warnf("save cmdline: %v", err)
	}
}

// abortLaunch terminates a hypervisor whose setup failed and removes its runtime files.
func (b *backend) abortLaunch(ctx context.Context, pid int, runDir string) {
	_ = terminateProcess(ctx, pid, b.binaryName(), apiSocketPath(runDir), b.terminateGrace())
	b.cleanupRuntimeFiles(runDir)
}

func (b *backend) cleanupRuntimeFiles(runDir string) {
	for _, name := range b.runtimeFiles() {
		p := filepath.Join(runDir, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			b.log.with("hypervisor.CleanupRuntimeFiles").Warnf("cleanup %s: %v", p, err)
		}
	}
}

package cocoonsim

import (
	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

// vmCommand builds "cocoon vm" with cocoon's subcommands, flags and defaults (cmd/vm/commands.go).
func (a *app) vmCommand() *cobra.Command {
	vmCmd := &cobra.Command{Use: "vm", Short: "Manage virtual machines"}

	createCmd := &cobra.Command{Use: "create [flags] IMAGE", Short: "Create a VM from an image", Args: cobra.ExactArgs(1), RunE: a.vmCreate}
	addVMFlags(createCmd, a.profile)
	addOutputFlag(createCmd)

	runCmd := &cobra.Command{Use: "run [flags] IMAGE", Short: "Create and start a VM from an image", Args: cobra.ExactArgs(1), RunE: a.vmRun}
	addVMFlags(runCmd, a.profile)
	addOutputFlag(runCmd)

	cloneCmd := &cobra.Command{Use: "clone [flags] SNAPSHOT", Short: "Clone a new VM from a snapshot", Args: cobra.ExactArgs(1), RunE: a.vmClone}
	if a.profile.SnapshotDirs {
		cloneCmd = &cobra.Command{Use: "clone [flags] [SNAPSHOT]", Short: "Clone a new VM from a snapshot (or a directory via --from-dir)", Args: cobra.MaximumNArgs(1), RunE: a.vmClone}
	}
	addCloneFlags(cloneCmd, a.profile)
	addOutputFlag(cloneCmd)

	startCmd := &cobra.Command{Use: "start VM [VM...]", Short: "Start created/stopped VM(s)", Args: cobra.MinimumNArgs(1), RunE: a.vmStart}
	addOutputFlag(startCmd)

	stopCmd := &cobra.Command{Use: "stop VM [VM...]", Short: "Stop running VM(s)", Args: cobra.MinimumNArgs(1), RunE: a.vmStop}
	stopCmd.Flags().Bool("force", false, "force stop (skip graceful shutdown, immediate SIGTERM/SIGKILL)")
	stopCmd.Flags().Int("timeout", 0, "ACPI shutdown timeout in seconds (0 = use config default)")
	addOutputFlag(stopCmd)

	listCmd := &cobra.Command{Use: "list", Aliases: []string{"ls"}, Short: "List VMs with status", RunE: a.vmList}
	addFormatFlag(listCmd)

	inspectCmd := &cobra.Command{Use: "inspect VM", Short: "Show detailed VM info (JSON)", Args: cobra.ExactArgs(1), RunE: a.vmInspect}

	consoleCmd := &cobra.Command{Use: "console VM", Short: "Attach interactive console to a running VM", Args: cobra.ExactArgs(1), RunE: notSimulated("vm console")}
	consoleCmd.Flags().String("escape-char", "^]", "escape character (single char or ^X caret notation)")

	rmCmd := &cobra.Command{Use: "rm [flags] VM [VM...]", Short: "Delete VM(s) (--force to stop running VMs first)", Args: cobra.MinimumNArgs(1), RunE: a.vmRM}
	rmCmd.Flags().Bool("force", false, "force delete running VMs")
	addOutputFlag(rmCmd)

	// v0.3.8's vm restore (its own flags) is not simulated; v0.5's is, beside vm hibernate.
	restoreCmd := &cobra.Command{Use: "restore [flags] VM SNAPSHOT", Short: "Restore a running VM to a previous snapshot", Args: cobra.ExactArgs(2), RunE: notSimulated("vm restore")}
	restoreCmd.Flags().Int("cpu", 0, "boot CPUs (0 = keep current)")
	restoreCmd.Flags().String("memory", "", "memory size (empty = keep current)")
	restoreCmd.Flags().String("storage", "", "COW disk size (empty = keep current)")
	restoreCmd.Flags().Bool("on-demand", false, "use UFFD on-demand memory loading for faster restore (CH only; snapshot file must remain on disk)")
	addOutputFlag(restoreCmd)
	if a.profile.Hibernate {
		restoreCmd = a.restoreCommand()
	}

	debugCmd := &cobra.Command{Use: "debug [flags] IMAGE", Short: "Generate hypervisor launch command (dry run)", Args: cobra.ExactArgs(1), RunE: notSimulated("vm debug")}
	addVMFlags(debugCmd, a.profile)
	debugCmd.Flags().Int("max-cpu", 8, "max CPUs")
	debugCmd.Flags().Int("balloon", 0, "balloon size in MB")
	debugCmd.Flags().String("cow", "", "COW disk path")
	debugCmd.Flags().String("ch", "cloud-hypervisor", "cloud-hypervisor binary path")

	statusCmd := &cobra.Command{Use: "status [VM...]", Short: "Watch VM status in real time", RunE: a.vmStatus}
	statusCmd.Flags().IntP("interval", "n", 5, "poll interval in seconds")
	statusCmd.Flags().Bool("event", false, "event stream mode (append changes instead of refreshing)")
	if a.profile.StatusOnce {
		statusCmd.Flags().BoolP("watch", "w", false, "refresh-loop mode (full-screen redraw each tick); omit for a one-shot snapshot")
		statusCmd.Flags().String("format", "", "output format: json (one-shot and event modes)")
	} else {
		statusCmd.Flags().String("format", "", "output format: json (event mode only)")
	}

	vmCmd.AddCommand(createCmd, runCmd, cloneCmd, startCmd, stopCmd, listCmd, inspectCmd, consoleCmd, rmCmd, restoreCmd, debugCmd, statusCmd)
	// v0.3.8 has no agent or attach commands: cobra knows no such command there.
	if a.profile.Agent {
		vmCmd.AddCommand(a.execCommand(), a.reseedCommand(), a.diskCommand(), a.deviceCommand())
	}
	if a.profile.VhostUserFs {
		vmCmd.AddCommand(a.fsCommand())
	}
	if a.profile.Hibernate {
		vmCmd.AddCommand(a.hibernateCommand())
	}
	return vmCmd
}

func addVMFlags(cmd *cobra.Command, p release.Profile) {
	f := cmd.Flags()
	f.Bool("fc", false, "use Firecracker backend instead of Cloud Hypervisor (OCI images only)")
	f.String("name", "", "VM name")
	f.Int("cpu", 2, "boot CPUs")
	f.String("memory", "1G", "memory size")
	f.String("storage", "10G", "COW disk size")
	f.Int("nics", 1, "number of network interfaces (0 = no network); multiple NICs with auto IP config only works for cloudimg; OCI images auto-configure only the last NIC, others require manual setup inside the guest")
	f.Int("queue-size", 0, "virtio-net ring depth per queue (0 = default 512; tradeoff: larger improves download throughput, smaller improves RPC latency)")
	f.Int("disk-queue-size", 0, "virtio-blk ring depth per device (0 = default 512; CH only, ignored by FC)")
	f.String("network", "", "CNI conflist name (empty = default); mutually exclusive with --bridge")
	f.String("bridge", "", "use TAP-on-bridge instead of CNI (value is bridge device, e.g. cni0); VM gets IP via DHCP from the bridge")
	f.String("user", "root", "guest username for cloud-init (cloudimg only)")
	f.String("password", "cocoon", "guest password for cloud-init (cloudimg only)")
	f.Bool("no-direct-io", false, "disable O_DIRECT on writable disks (use page cache instead; CH only)")
	f.Bool("windows", false, "Windows guest (UEFI boot, kvm_hyperv=on, no cidata)")
	if p.VhostUserFs {
		f.Bool("shared-memory", false, "enable CH memory shared=on; required to attach vhost-user-fs later (CH only, fixed for VM lifetime)")
	}
	f.StringArray("data-disk", nil, "extra data disk: size=20G[,name=...][,fstype=ext4|none][,mount=/mnt/x][,directio=on|off|auto]; repeatable")
}

func addCloneFlags(cmd *cobra.Command, p release.Profile) {
	f := cmd.Flags()
	f.String("name", "", "VM name (default: cocoon-clone-<id>)")
	if p.CloneResizes {
		f.Int("cpu", 0, "boot CPUs (0 = inherit from snapshot)")
		f.String("memory", "", "memory size (empty = inherit from snapshot)")
		f.String("storage", "", "COW disk size (empty = inherit from snapshot)")
	}
	f.Int("nics", 0, "number of NICs (0 = inherit from snapshot)")
	f.Int("queue-size", 0, "virtio-net ring depth per queue (0 = inherit from snapshot)")
	f.Int("disk-queue-size", 0, "virtio-blk ring depth per device (0 = inherit from snapshot)")
	f.String("network", "", "CNI conflist name (empty = inherit from source VM)")
	f.String("bridge", "", "use TAP-on-bridge instead of CNI (value is bridge device, e.g. cni0)")
	f.Bool("no-direct-io", false, "disable O_DIRECT on writable disks (inherit from snapshot if not set)")
	if p.RestoreMode {
		f.String("restore-mode", "", "memory restore mode: copy, ondemand (UFFD) or mmap (CoW map); CH only (default mmap for plain snapshots, else copy)")
	} else {
		f.Bool("on-demand", false, "use UFFD on-demand memory loading for faster clone (CH only; snapshot file must remain on disk)")
	}
	f.Bool("pull", false, "auto-pull base image if not found locally (for cross-node clone)")
	if p.SnapshotDirs {
		f.String("from-dir", "", "clone from a snapshot directory (must contain snapshot.json) instead of the local snapshot DB; mutually exclusive with positional SNAPSHOT")
	}
}

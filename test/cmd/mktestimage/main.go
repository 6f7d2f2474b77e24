// Command mktestimage writes importable test artifacts for the cocoon simulator (and real cocoon):
//
//	mktestimage snapshot [--name N --cpu 1 --memory 512M --storage 10G --image-type oci|cloudimg
//	                      --hypervisor cloud-hypervisor --nics 0 --root-dir DIR --install-base
//	                      --ignore-power-button --poweroff-after 30s --crash-after 10s --fail-boot
//	                      --http-port 80 --ssh-authorized-key "$(cat id_ed25519.pub)" --busybox] -o FILE
//	mktestimage qcow2 [--size 1G --ignore-power-button ...] -o FILE
//	mktestimage layer [--ignore-power-button ...] -o FILE
//
// "-o -" writes to stdout.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

func main() {
	if err := rootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:          "mktestimage",
		Short:        "Write test images for the cocoon simulator",
		SilenceUsage: true,
	}
	root.AddCommand(snapshotCommand(), qcow2Command(), layerCommand())
	return root
}

func snapshotCommand() *cobra.Command {
	var opts testimage.SnapshotOptions
	var memory, storage, output string
	var installBase bool
	cmd := &cobra.Command{
		Use:   "snapshot -o FILE",
		Short: "Write a snapshot archive as `cocoon snapshot export` makes it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Memory, err = parseSize(memory); err != nil {
				return fmt.Errorf("--memory: %w", err)
			}
			if opts.Storage, err = parseSize(storage); err != nil {
				return fmt.Errorf("--storage: %w", err)
			}
			if installBase {
				if err := testimage.InstallBaseFiles(opts); err != nil {
					return fmt.Errorf("install base files: %w", err)
				}
			}
			return writeOutput(cmd, output, func(w io.Writer) error { return testimage.WriteSnapshotArchive(w, opts) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Name, "name", "", "snapshot name recorded in snapshot.json")
	f.StringVar(&opts.Description, "description", "", "snapshot description")
	f.IntVar(&opts.CPU, "cpu", 1, "vCPUs")
	f.StringVar(&memory, "memory", "512M", "memory size")
	f.StringVar(&storage, "storage", "10G", "COW disk size")
	f.StringVar(&opts.Hypervisor, "hypervisor", cocoon.HypervisorCloudHypervisor, "cloud-hypervisor or firecracker")
	f.StringVar(&opts.ImageType, "image-type", cocoon.ImageTypeOCI, "oci (direct boot) or cloudimg (UEFI)")
	f.StringVar(&opts.Image, "image", "", "image reference recorded in the snapshot")
	f.IntVar(&opts.NICs, "nics", 0, "NICs of the snapshotted VM")
	f.BoolVar(&opts.NoVsock, "no-vsock", false, "a Firecracker snapshot without a vsock device (as cocoon v0.3.8 takes them)")
	f.StringVar(&opts.RootDir, "root-dir", "", "cocoon root dir of the host that will clone it (default /var/lib/cocoon)")
	f.BoolVar(&installBase, "install-base", false, "also create the base files a clone needs under --root-dir")
	addGuestFlags(cmd, &opts.Guest)
	addOutputFlag(cmd, &output)
	return cmd
}

func qcow2Command() *cobra.Command {
	var spec guest.Spec
	var size, output string
	cmd := &cobra.Command{
		Use:   "qcow2 --size SIZE -o FILE",
		Short: "Write an empty qcow2 v3 cloud image without backing file (guest behaviour in a header extension)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseSize(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			return writeOutput(cmd, output, func(w io.Writer) error { return testimage.WriteQCOW2WithGuest(w, n, spec) })
		},
	}
	cmd.Flags().StringVar(&size, "size", "1G", "virtual size")
	addGuestFlags(cmd, &spec)
	addOutputFlag(cmd, &output)
	return cmd
}

func layerCommand() *cobra.Command {
	var opts testimage.LayerOptions
	var output string
	cmd := &cobra.Command{
		Use:   "layer -o FILE",
		Short: "Write a one-layer OCI image tar (boot/vmlinuz, boot/initrd.img)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeOutput(cmd, output, func(w io.Writer) error { return testimage.WriteOCILayer(w, opts) })
		},
	}
	addGuestFlags(cmd, &opts.Guest)
	addOutputFlag(cmd, &output)
	return cmd
}

func addGuestFlags(cmd *cobra.Command, spec *guest.Spec) {
	f := cmd.Flags()
	f.BoolVar(&spec.IgnorePowerButton, "ignore-power-button", false, "guest ignores ACPI power-button presses")
	f.DurationVar((*time.Duration)(&spec.PoweroffAfter), "poweroff-after", 0, "guest powers itself off after this long")
	f.DurationVar((*time.Duration)(&spec.CrashAfter), "crash-after", 0, "hypervisor dies abruptly after this long")
	f.BoolVar(&spec.FailBoot, "fail-boot", false, "hypervisor fails before its API socket appears")
	f.IntVar(&spec.HTTPPort, "http-port", 0, "guest serves HTTP on this port (GET / answers 200 with its hostname)")
	f.StringVar(&spec.SSHAuthorizedKey, "ssh-authorized-key", "", `guest runs sshd on port 22 for root with this public key ("ssh-ed25519 AAAA...")`)
	f.BoolVar(&spec.Busybox, "busybox", false, "guest's userland is busybox's (its applets first on PATH; top runs without a terminal)")
}

func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "", `output file ("-" for stdout)`)
	_ = cmd.MarkFlagRequired("output")
}

// writeOutput writes to stdout for "-", else to a new file that is removed again on failure.
func writeOutput(cmd *cobra.Command, path string, write func(io.Writer) error) (err error) {
	if path == "-" {
		return write(cmd.OutOrStdout())
	}
	f, err := os.Create(path) //nolint:gosec // operator-chosen output path
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, f.Close())
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	return write(f)
}

// parseSize reads 512M, 10G, 1T (binary units) or a plain byte count.
func parseSize(s string) (int64, error) {
	units := map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
	upper := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(s, "iB"), "B"))
	mul := int64(1)
	if n := len(upper); n > 0 && units[upper[n-1]] != 0 {
		mul, upper = units[upper[n-1]], upper[:n-1]
	}
	n, err := strconv.ParseInt(upper, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mul, nil
}

package testimage

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// LayerOptions describes an OCI image layer for the simulator.
type LayerOptions struct {
	// Guest is the behaviour of VMs booted from the image; the zero value is a normal guest.
	Guest guest.Spec
	// Kernel and Initrd, when set, are a real kernel and initramfs for boot/: the simulator runs
	// such a kernel under QEMU instead of the simulated guest.
	Kernel, Initrd []byte
}

// archiveTime is the fixed modification time of generated entries, so output is reproducible.
var archiveTime = time.Unix(1700000000, 0).UTC()

// WriteOCILayer writes a single-layer OCI image as a tar: boot/vmlinuz and boot/initrd.img (which
// cocoon requires for direct boot; placeholders here) and, when opts.Guest is set, the guest
// behaviour file at the root. Import it with `cocoon image import NAME FILE` (needs mkfs.erofs,
// like cocoon) or cocoonsim.SeedOCIImage.
func WriteOCILayer(w io.Writer, opts LayerOptions) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "boot/", Mode: 0o755, ModTime: archiveTime}); err != nil {
		return err
	}
	files := []archiveFile{
		{name: "boot/vmlinuz", data: orPlaceholder(opts.Kernel, "kernel")},
		{name: "boot/initrd.img", data: orPlaceholder(opts.Initrd, "initrd")},
	}
	if !opts.Guest.IsZero() {
		if err := opts.Guest.Validate(); err != nil {
			return fmt.Errorf("guest behaviour: %w", err)
		}
		spec, err := json.MarshalIndent(opts.Guest, "", "  ")
		if err != nil {
			return fmt.Errorf("marshal guest behaviour: %w", err)
		}
		files = append(files, archiveFile{name: guest.SpecFile, data: spec})
	}
	for _, f := range files {
		if err := writeTarFile(tw, f.name, f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// archiveFile is one regular file to put in a tar; a sparse one has the given real size and its
// data at offset 0.
type archiveFile struct {
	name       string
	data       []byte
	sparseSize int64
}

func orPlaceholder(data []byte, what string) []byte {
	if len(data) > 0 {
		return data
	}
	return placeholder(what)
}

// placeholder is the content of a boot file the simulated guest never executes.
func placeholder(what string) []byte {
	return []byte("cocoon-sim " + what + " (placeholder, never executed)\n")
}

func writeTarFile(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o644, ModTime: archiveTime}); err != nil {
		return fmt.Errorf("write %s header: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

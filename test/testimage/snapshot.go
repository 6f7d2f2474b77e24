// Package testimage builds artifacts that the cocoon simulator (and real cocoon) can import:
// snapshot archives as `cocoon snapshot export` writes them, qcow2 cloud images, and OCI image
// layers. Tests and the demo use it to get importable images without cocoon, qemu-img or a
// registry.
package testimage

import (
	"archive/tar"
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
)

// SnapshotOptions describes a snapshot archive. Zero fields take the defaults noted.
type SnapshotOptions struct {
	// Name and Description go into snapshot.json; an empty Name makes an unnamed snapshot (give
	// one with `snapshot import --name`).
	Name        string
	Description string
	CPU         int   // vCPUs; default 1
	Memory      int64 // bytes; default 512 MiB (cocoon's minimum)
	Storage     int64 // COW disk size in bytes; default 10 GiB (cocoon's minimum)
	// Hypervisor is cocoon.HypervisorCloudHypervisor (default) or cocoon.HypervisorFirecracker.
	Hypervisor string
	// NoVsock makes a Firecracker snapshot of a VM without a vsock device, as cocoon v0.3.8
	// made them: a cocoon without vsock_override (v0.3.8) can load only such a snapshot elsewhere
	// than where it was taken.
	NoVsock bool
	// ImageType is cocoon.ImageTypeOCI (default: direct boot, PTY console) or
	// cocoon.ImageTypeCloudImg (UEFI, serial console socket). Firecracker snapshots are OCI only.
	ImageType string
	// Image is the image reference recorded in the snapshot; default DefaultBaseImage.
	Image string
	// ImageDigest is the base image's digest recorded in the snapshot; default one derived from
	// Image, which is also the base files' name (InstallBaseFiles).
	ImageDigest string
	// NICs is the number of NICs the snapshotted VM had.
	NICs int
	// RootDir is the cocoon --root-dir of the host the snapshot will be cloned on; the snapshot
	// refers to its base files (image layer, kernel, initrd or firmware) there, as a real one
	// does. Default /var/lib/cocoon. InstallBaseFiles creates those files.
	RootDir string
	// Guest is the behaviour of VMs cloned from the snapshot.
	Guest guest.Spec
	// SharedMemory makes the snapshot of a VM created with --shared-memory (cocoon v0.5): its
	// clones can take virtio-fs shares.
	SharedMemory bool
	// GuestClock, when set, is the guest's wall time when the snapshot was taken: its clones'
	// clocks go on from there, as a restored guest's do. Unset, they start with the host's time.
	GuestClock time.Time
}

func (o SnapshotOptions) withDefaults() SnapshotOptions {
	if o.CPU == 0 {
		o.CPU = 1
	}
	if o.Memory == 0 {
		o.Memory = 512 << 20
	}
	if o.Storage == 0 {
		o.Storage = 10 << 30
	}
	if o.Hypervisor == "" {
		o.Hypervisor = cocoon.HypervisorCloudHypervisor
	}
	if o.ImageType == "" {
		o.ImageType = cocoon.ImageTypeOCI
	}
	if o.Image == "" {
		o.Image = DefaultBaseImage
	}
	if o.RootDir == "" {
		o.RootDir = "/var/lib/cocoon"
	}
	return o
}

// DefaultBaseImage is the base a snapshot records unless told otherwise: the name of an imported
// image, which no registry serves. Its upper case makes it no valid reference, so cocoon's
// `vm clone --pull` gives up on it at once, as on any imported base whose files are on the node,
// instead of asking Docker Hub for it (which, with no network, takes seconds of retries).
const DefaultBaseImage = "Cocoon-Sim/Guest:latest"

// baseFiles are the shared files a clone of the snapshot needs on the host.
type baseFiles struct {
	blobHex  string
	blob     string // OCI layer blob or cloud image base qcow2
	kernel   string
	initrd   string
	firmware string
}

func (o SnapshotOptions) baseFiles() baseFiles {
	sum := sha256.Sum256([]byte("cocoon-sim base image " + o.Image))
	h := hex.EncodeToString(sum[:])
	if o.ImageType == cocoon.ImageTypeCloudImg {
		return baseFiles{
			blobHex:  h,
			blob:     filepath.Join(o.RootDir, "cloudimg", "blobs", h+".qcow2"),
			firmware: filepath.Join(o.RootDir, "firmware", "CLOUDHV.fd"),
		}
	}
	boot := filepath.Join(o.RootDir, "oci", "boot", h)
	return baseFiles{
		blobHex: h,
		blob:    filepath.Join(o.RootDir, "oci", "blobs", h+".erofs"),
		kernel:  filepath.Join(boot, "vmlinuz"),
		initrd:  filepath.Join(boot, "initrd.img"),
	}
}

// InstallBaseFiles creates, under opts.RootDir, the base files a snapshot written with the same
// options refers to, so that `vm clone` finds them (cocoon checks they exist; their content does
// not matter to the simulated guest). It does not register an image.
func InstallBaseFiles(opts SnapshotOptions) error {
	opts = opts.withDefaults()
	base := opts.baseFiles()
	write := func(path string, data []byte) error {
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o644) //nolint:gosec // image files are world-readable in cocoon
	}
	files := map[string][]byte{base.blob: placeholder("image layer"), base.kernel: placeholder("kernel"), base.initrd: placeholder("initrd")}
	if opts.ImageType == cocoon.ImageTypeCloudImg {
		qcow, err := qcow2Bytes(opts.Storage)
		if err != nil {
			return err
		}
		files = map[string][]byte{base.blob: qcow, base.firmware: placeholder("UEFI firmware")}
	}
	for path, data := range files {
		if err := write(path, data); err != nil {
			return fmt.Errorf("write base file: %w", err)
		}
	}
	return nil
}

// WriteSnapshotArchive writes a snapshot archive exactly as `cocoon snapshot export` makes it: a
// tar whose first entry is snapshot.json (cocoon.SnapshotExport, version 1), followed in name
// order by the data files of a cloud-hypervisor snapshot (config.json, state.json, memory-range-0,
// cow.raw or overlay.qcow2 plus cidata.img, cocoon.json) or of a Firecracker one (vmstate, mem,
// cow.raw, cocoon.json), and the guest behaviour file when opts.Guest is set. cow.raw is a sparse
// entry carrying cocoon's COCOON.sparse.map/COCOON.sparse.size PAX records.
func WriteSnapshotArchive(w io.Writer, opts SnapshotOptions) error {
	opts = opts.withDefaults()
	if opts.Hypervisor == cocoon.HypervisorFirecracker && opts.ImageType != cocoon.ImageTypeOCI {
		return fmt.Errorf("firecracker snapshots are OCI (direct boot) only")
	}
	s := newSnapshotLayout(opts)
	meta, err := json.MarshalIndent(cocoon.SnapshotExport{Config: s.config(), Version: cocoon.SnapshotExportVersion}, "", "  ")
	if err != nil {
		return err
	}
	files, err := s.dataFiles()
	if err != nil {
		return err
	}
	// Like cocoon's TarDir, the data files follow in directory (name) order.
	slices.SortFunc(files, func(a, b archiveFile) int { return strings.Compare(a.name, b.name) })
	tw := tar.NewWriter(w)
	if err := writeTarFile(tw, "snapshot.json", append(meta, '\n')); err != nil {
		return err
	}
	for _, f := range files {
		if err := writeEntry(tw, f); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeEntry writes a plain file, or, when sparseSize is set, cocoon's sparse entry: only the
// data (here one segment at offset 0), with COCOON.sparse.map/COCOON.sparse.size PAX records.
func writeEntry(tw *tar.Writer, f archiveFile) error {
	if f.sparseSize == 0 {
		return writeTarFile(tw, f.name, f.data)
	}
	sparseMap, err := json.Marshal([]struct {
		Offset int64 `json:"o"`
		Length int64 `json:"l"`
	}{{0, int64(len(f.data))}})
	if err != nil {
		return err
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg, Name: f.name, Mode: 0o600, ModTime: archiveTime, Size: int64(len(f.data)),
		PAXRecords: map[string]string{"COCOON.sparse.map": string(sparseMap), "COCOON.sparse.size": strconv.FormatInt(f.sparseSize, 10)},
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s header: %w", f.name, err)
	}
	_, err = tw.Write(f.data)
	return err
}

// snapshotLayout is the source VM the archive pretends to come from.
type snapshotLayout struct {
	opts    SnapshotOptions
	base    baseFiles
	vmID    string
	runDir  string
	storage []*cocoon.StorageConfig
	boot    bootConfig
}

// bootConfig is cocoon's types.BootConfig as the snapshot sidecar stores it.
type bootConfig struct {
	KernelPath   string `json:"kernel_path,omitempty"`
	InitrdPath   string `json:"initrd_path,omitempty"`
	Cmdline      string `json:"cmdline,omitempty"`
	FirmwarePath string `json:"firmware_path,omitempty"`
}

func newSnapshotLayout(opts SnapshotOptions) *snapshotLayout {
	sum := sha256.Sum256([]byte("cocoon-sim source VM " + opts.Name + opts.Image))
	vmID := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16])
	dir := "cloudhypervisor"
	if opts.Hypervisor == cocoon.HypervisorFirecracker {
		dir = "firecracker"
	}
	s := &snapshotLayout{opts: opts, base: opts.baseFiles(), vmID: vmID, runDir: filepath.Join(opts.RootDir, "run", dir, vmID)}
	if opts.ImageType == cocoon.ImageTypeCloudImg {
		s.storage = []*cocoon.StorageConfig{
			{Path: filepath.Join(s.runDir, "overlay.qcow2"), Role: cocoon.StorageRoleCOW},
			{Path: filepath.Join(s.runDir, "cidata.img"), RO: true, Role: cocoon.StorageRoleCidata},
		}
		s.boot = bootConfig{FirmwarePath: s.base.firmware}
		return s
	}
	s.storage = []*cocoon.StorageConfig{
		{Path: s.base.blob, RO: true, Serial: "cocoon-layer0", Role: cocoon.StorageRoleLayer},
		{Path: filepath.Join(s.runDir, "cow.raw"), Serial: "cocoon-cow", Role: cocoon.StorageRoleCOW},
	}
	s.boot = bootConfig{KernelPath: s.base.kernel, InitrdPath: s.base.initrd, Cmdline: s.cmdline()}
	return s
}

// cmdline is the direct-boot kernel command line cocoon gave the source VM. Its NICs, if any,
// had no static address (DHCP), so there is no ip= parameter, only the hostname.
func (s *snapshotLayout) cmdline() string {
	line := "console=hvc0 loglevel=3 boot=cocoon-overlay cocoon.layers=cocoon-layer0 cocoon.cow=cocoon-cow clocksource=kvm-clock rw"
	if s.opts.Hypervisor == cocoon.HypervisorFirecracker {
		line = "console=ttyS0 reboot=k loglevel=3 i8042.noaux 8250.nr_uarts=1 boot=cocoon-overlay cocoon.layers=/dev/vda cocoon.cow=/dev/vdb clocksource=kvm-clock rw"
	}
	if s.opts.NICs > 0 {
		line += " net.ifnames=0 cocoon.hostname=" + s.opts.Name
	}
	return line
}

func (s *snapshotLayout) config() cocoon.SnapshotConfig {
	o := s.opts
	return cocoon.SnapshotConfig{
		Config: cocoon.Config{
			CPU: o.CPU, Memory: o.Memory, Storage: o.Storage, Image: o.Image,
			ImageDigest: cmp.Or(o.ImageDigest, "sha256:"+s.base.blobHex), ImageType: o.ImageType, SharedMemory: o.SharedMemory,
		},
		Name: o.Name, Description: o.Description, Hypervisor: o.Hypervisor, NICs: o.NICs,
		ImageBlobIDs: map[string]struct{}{s.base.blobHex: {}},
	}
}

// dataFiles are the snapshot's data files.
func (s *snapshotLayout) dataFiles() ([]archiveFile, error) {
	o := s.opts
	var files []archiveFile
	add := func(name string, v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("marshal %s: %w", name, err)
		}
		files = append(files, archiveFile{name: name, data: data})
		return nil
	}
	memory := fmt.Appendf(nil, "cocoon-sim guest memory of %s\n", o.Name)
	if o.ImageType == cocoon.ImageTypeOCI {
		// The COW disk of a direct-boot VM: a 4 KiB data block in a sparse file of the storage size.
		cow := make([]byte, 4096)
		copy(cow, "cocoon-sim cow disk\n")
		files = append(files, archiveFile{name: "cow.raw", data: cow, sparseSize: o.Storage})
	}
	sidecar := map[string]any{"storage_configs": s.storage, "boot_config": s.boot}
	if o.Hypervisor == cocoon.HypervisorFirecracker {
		// Firecracker's sidecar has no command line (a clone rebuilds it), and its CPU and memory.
		boot := s.boot
		boot.Cmdline = ""
		sidecar["boot_config"], sidecar["cpu"], sidecar["memory"] = boot, o.CPU, o.Memory
		vsock := filepath.Join(s.runDir, guest.VsockSocketName)
		if o.NoVsock {
			vsock = ""
		}
		vmstate, err := guest.EncodeFCState(s.fcConfig(), o.Name, SnapshotMachineID(o.Name), vsock, o.GuestClock)
		if err != nil {
			return nil, err
		}
		files = append(files, archiveFile{name: guest.FCStateFile, data: vmstate}, archiveFile{name: guest.FCMemoryFile, data: memory})
	} else {
		if err := add("config.json", s.chConfig()); err != nil {
			return nil, err
		}
		state := map[string]any{"vm_name": o.Name, "state": "Paused", "machine_id": SnapshotMachineID(o.Name)}
		if !o.GuestClock.IsZero() {
			state["guest_clock_ns"] = o.GuestClock.UnixNano()
		}
		if err := add("state.json", state); err != nil {
			return nil, err
		}
		files = append(files, archiveFile{name: "memory-range-0", data: memory})
		if o.ImageType == cocoon.ImageTypeCloudImg {
			qcow, err := qcow2Bytes(o.Storage)
			if err != nil {
				return nil, err
			}
			files = append(files, archiveFile{name: "overlay.qcow2", data: qcow}, archiveFile{name: "cidata.img", data: placeholder("cloud-init seed")})
		}
	}
	if err := add("cocoon.json", sidecar); err != nil {
		return nil, err
	}
	if !o.Guest.IsZero() {
		if err := o.Guest.Validate(); err != nil {
			return nil, fmt.Errorf("guest behaviour: %w", err)
		}
		if err := add(guest.SpecFile, o.Guest); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// chConfig is the cloud-hypervisor config.json of the source VM, its disks in sidecar order.
func (s *snapshotLayout) chConfig() *guest.VMConfig {
	o := s.opts
	cfg := &guest.VMConfig{
		CPUs:     guest.CPUs{BootVCPUs: o.CPU, MaxVCPUs: max(o.CPU, runtime.NumCPU())},
		Memory:   guest.Memory{Size: o.Memory, Shared: o.SharedMemory},
		Balloon:  &guest.Balloon{ID: "_balloon0", Size: o.Memory / 4, DeflateOnOOM: true, FreePageReporting: true},
		RNG:      guest.RNG{Src: "/dev/urandom"},
		Watchdog: true,
	}
	for i, sc := range s.storage {
		d := guest.Disk{ID: fmt.Sprintf("_disk%d", i), Path: sc.Path, ReadOnly: sc.RO, Serial: sc.Serial, NumQueues: o.CPU, QueueSize: 512, ImageType: "Raw"}
		switch {
		case filepath.Ext(sc.Path) == ".qcow2":
			d.ImageType, d.BackingFiles, d.DirectIO = "Qcow2", true, true
		case !sc.RO:
			d.Sparse, d.DirectIO = true, true
		}
		cfg.Disks = append(cfg.Disks, d)
	}
	for i := range o.NICs {
		cfg.Nets = append(cfg.Nets, guest.Net{
			ID: fmt.Sprintf("_net%d", i), Tap: fmt.Sprintf("tap%s-%d", s.vmID[:8], i),
			Mac: fmt.Sprintf("02:00:00:00:00:%02x", i+1), NumQueues: 2 * o.CPU, QueueSize: 512,
		})
	}
	if o.ImageType == cocoon.ImageTypeCloudImg {
		cfg.Payload = &guest.Payload{Firmware: s.base.firmware}
		cfg.Serial = &guest.RuntimeFile{Mode: guest.ModeSocket, Socket: filepath.Join(s.runDir, "console.sock")}
		cfg.Console = &guest.RuntimeFile{Mode: guest.ModeOff}
		return cfg
	}
	cfg.Payload = &guest.Payload{Kernel: s.base.kernel, Initramfs: s.base.initrd, Cmdline: s.cmdline()}
	cfg.Serial = &guest.RuntimeFile{Mode: guest.ModeOff}
	cfg.Console = &guest.RuntimeFile{Mode: guest.ModePty}
	return cfg
}

// fcConfig is the source VM as Firecracker held it: drives and interfaces by position, the
// serial console on Firecracker's tty.
func (s *snapshotLayout) fcConfig() guest.VMConfig {
	cfg := *s.chConfig()
	cfg.Serial, cfg.Console = &guest.RuntimeFile{Mode: guest.ModeTty}, nil
	for i := range cfg.Disks {
		cfg.Disks[i].ID = fmt.Sprintf("drive_%d", i)
	}
	for i := range cfg.Nets {
		cfg.Nets[i].ID = fmt.Sprintf("eth%d", i)
	}
	return cfg
}

// SnapshotMachineID is the guest /etc/machine-id a snapshot named name was taken with: every
// clone starts with it, as clones of a real snapshot do, until something reseeds the guest.
func SnapshotMachineID(name string) string {
	sum := sha256.Sum256([]byte("machine-id of " + name))
	return hex.EncodeToString(sum[:16])
}

package cocoonsim

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nocloud"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/release"
)

// Disk serials and file names cocoon uses.
const (
	cowSerial      = "cocoon-cow"
	cowRawFile     = "cow.raw"
	overlayFile    = "overlay.qcow2"
	cidataFile     = "cidata.img"
	qcow2HeaderLen = 32
)

func createSparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) //nolint:gosec // VM run dir
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	truncErr := f.Truncate(size)
	closeErr := f.Close()
	if truncErr != nil {
		return fmt.Errorf("truncate %s: %w", path, truncErr)
	}
	if closeErr != nil {
		return fmt.Errorf("close %s: %w", path, closeErr)
	}
	return nil
}

// mkfsExt4 formats a COW or data disk exactly as cocoon does; the real tool runs, so a host
// without e2fsprogs fails the same way.
func mkfsExt4(ctx context.Context, path string) error {
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-F", "-m", "0", "-q",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,discard", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %s: %w", strings.TrimSpace(string(out)), err)
	}
	return nil
}

// qemuImgCreateOverlay creates a cloud image VM's qcow2 overlay on its base blob with the real
// qemu-img, as cocoon does.
func qemuImgCreateOverlay(ctx context.Context, basePath, overlayPath string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-f", "qcow2", "-F", "qcow2",
		"-b", basePath, overlayPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create overlay: %s: %w", strings.TrimSpace(string(out)), err)
	}
	return nil
}

// expandImage grows a COW disk to targetSize: truncate for raw, qemu-img resize for qcow2. It
// never shrinks.
func expandImage(ctx context.Context, path string, targetSize int64, directBoot bool) error {
	if directBoot {
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		if targetSize <= fi.Size() {
			return nil
		}
		if err := os.Truncate(path, targetSize); err != nil {
			return fmt.Errorf("truncate %s to %d: %w", path, targetSize, err)
		}
		return nil
	}
	virtualSize, err := readQcow2VirtualSize(path)
	if err != nil {
		return fmt.Errorf("read qcow2 virtual size %s: %w", path, err)
	}
	if targetSize <= virtualSize {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "qemu-img", "resize", path, fmt.Sprintf("%d", targetSize)).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img resize %s: %s: %w", path, strings.TrimSpace(string(out)), err)
	}
	return nil
}

func readQcow2VirtualSize(path string) (int64, error) {
	f, err := os.Open(path) //nolint:gosec // VM run dir
	if err != nil {
		return 0, err
	}
	defer f.Close() //nolint:errcheck
	var hdr [qcow2HeaderLen]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return 0, fmt.Errorf("read header: %w", err)
	}
	return int64(binary.BigEndian.Uint64(hdr[24:32])), nil //nolint:gosec // qcow2 sizes fit int64
}

// writeCidata writes the per-VM cloud-init seed as cocoon's generateCidata does: a FAT12 NoCloud
// image (package nocloud) naming the VM's ID and name, the user and password of vm create, the
// VM's NICs and DNS servers, and the data disks cloud-init mounts. The content is the release's
// the simulator plays.
func writeCidata(path, vmID string, spec *vmSpec, dns []string, nets []*cocoon.NetworkConfig, storage []*cocoon.StorageConfig) error {
	prof, err := release.Current()
	if err != nil {
		return err
	}
	rev := nocloud.V038
	if prof.CidataV05 {
		rev = nocloud.V05
	}
	cfg := &nocloud.Config{InstanceID: vmID, Hostname: spec.Name, Username: spec.User, Password: spec.Password, DNS: dns}
	for _, n := range nets {
		if n == nil || n.Mac == "" {
			continue
		}
		nic := nocloud.NIC{MAC: n.Mac}
		if n.Network != nil {
			nic.IP, nic.Prefix, nic.Gateway = n.Network.IP, n.Network.Prefix, n.Network.Gateway
		}
		cfg.Networks = append(cfg.Networks, nic)
	}
	// cocoon's buildMountSpecs: data disks with a mount point and a file system to mount.
	for _, sc := range storage {
		if sc.Role != cocoon.StorageRoleData || sc.MountPoint == "" || sc.FSType == "" || sc.FSType == fsTypeNone {
			continue
		}
		cfg.Mounts = append(cfg.Mounts, nocloud.Mount{Device: "/dev/disk/by-id/virtio-" + sc.Serial, MountPoint: sc.MountPoint, FSType: sc.FSType, Options: "defaults,nofail"})
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) //nolint:gosec // VM run dir
	if err != nil {
		return fmt.Errorf("create cidata: %w", err)
	}
	if err := nocloud.Write(f, cfg, rev, time.Now()); err != nil {
		_ = f.Close()
		return fmt.Errorf("generate cidata: %w", err)
	}
	return f.Close()
}

// validateStorageConfigs is cocoon's ValidateStorageConfigs: role/read-only invariants and data
// disk rules, checked wherever disks are loaded or finalised.
func validateStorageConfigs(configs []*cocoon.StorageConfig) error {
	for i, sc := range configs {
		if sc == nil {
			return fmt.Errorf("storage config %d: nil", i)
		}
		switch sc.Role {
		case cocoon.StorageRoleLayer, cocoon.StorageRoleCidata:
			if !sc.RO {
				return fmt.Errorf("storage config %d (%s): role %s requires RO=true", i, sc.Path, sc.Role)
			}
		case cocoon.StorageRoleCOW, cocoon.StorageRoleData:
			if sc.RO {
				return fmt.Errorf("storage config %d (%s): role %s requires RO=false", i, sc.Path, sc.Role)
			}
		default:
			return fmt.Errorf("storage config %d (%s): role must be one of layer/cow/cidata/data, got %q", i, sc.Path, sc.Role)
		}
		if sc.Role != cocoon.StorageRoleData {
			if sc.DirectIO != nil {
				return fmt.Errorf("storage config %d (%s): direct_io only allowed on data disks", i, sc.Path)
			}
			continue
		}
		if sc.FSType != fsTypeExt4 && sc.FSType != fsTypeNone {
			return fmt.Errorf("data disk %s: fstype must be ext4 or none, got %q", sc.Serial, sc.FSType)
		}
		if sc.FSType == fsTypeNone && sc.MountPoint != "" {
			return fmt.Errorf("data disk %s: fstype=none requires mount_point empty", sc.Serial)
		}
		if sc.MountPoint != "" && !filepath.IsAbs(sc.MountPoint) {
			return fmt.Errorf("data disk %s: mount_point must be absolute, got %q", sc.Serial, sc.MountPoint)
		}
		if !validDataDiskName(sc.Serial) {
			return fmt.Errorf("data disk: serial %q does not match name rules", sc.Serial)
		}
	}
	return nil
}

// verifyBaseFiles checks that the shared files a VM boots from (image layers, kernel, initrd,
// firmware) exist on this host.
func verifyBaseFiles(storage []*cocoon.StorageConfig, boot *bootConfig) error {
	for _, sc := range storage {
		if sc.Role != cocoon.StorageRoleLayer {
			continue
		}
		if _, err := os.Stat(sc.Path); err != nil {
			return fmt.Errorf("base layer %s: %w", sc.Path, err)
		}
	}
	if boot == nil {
		return nil
	}
	for _, check := range []struct{ name, path string }{
		{"kernel", boot.KernelPath}, {"initrd", boot.InitrdPath}, {"firmware", boot.FirmwarePath},
	} {
		if check.path == "" {
			continue
		}
		if _, err := os.Stat(check.path); err != nil {
			return fmt.Errorf("%s %s: %w", check.name, check.path, err)
		}
	}
	return nil
}

// validFile reports whether path is a non-empty regular file.
func validFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Size() > 0
}

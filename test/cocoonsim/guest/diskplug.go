package guest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// plugDisk shows a hot-added disk to the running guest as its kernel and udev would: a block
// device /dev/vdX (here the host file itself, mounted there, so what the guest writes reaches it)
// and /dev/disk/by-id/virtio-<serial>. The hypervisor cannot enter the guest's mount namespace
// itself (a Go process has threads), so nsenter does, into its PID namespace too so that
// /proc/self is the shell's own and the file's detached mount (fd 3) can be moved into place. It
// returns the device's name.
func (s *simulatedOS) plugDisk(d Disk) (string, error) {
	// A bind of a file outside the guest's mount namespace is refused (EINVAL); a detached copy
	// of its mount may be attached anywhere.
	treeFD, err := unix.OpenTree(unix.AT_FDCWD, d.Path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("open disk %s: %w", d.Path, err)
	}
	f := os.NewFile(uintptr(treeFD), d.Path)
	defer f.Close() //nolint:errcheck
	script := `set -e
for l in b c d e f g h i j k l m n o p q r s t u v w x y z; do [ -e /dev/vd$l ] || break; done
dev=vd$l
: > /dev/$dev
mount --no-canonicalize --move /proc/self/fd/3 /dev/$dev || { rm -f /dev/$dev; exit 1; }
`
	if d.ReadOnly {
		script += "mount -o remount,bind,ro /dev/$dev\n"
	}
	if d.Serial != "" {
		script += "mkdir -p /dev/disk/by-id\nln -sfn ../../$dev \"/dev/disk/by-id/virtio-$1\"\n"
	}
	script += "echo $dev\n"
	out, err := s.inGuestNamespaces(script, []*os.File{f}, truncateSerial(d.Serial))
	if err != nil {
		return "", fmt.Errorf("hot-plug disk %s into the guest: %w", d.ID, err)
	}
	return strings.TrimSpace(out), nil
}

// unplugDisk takes a disk away from the guest, as an eject does.
func (s *simulatedOS) unplugDisk(dev, serial string) error {
	script := "umount -l \"/dev/$1\" 2>/dev/null || true\nrm -f \"/dev/$1\"\n"
	if serial != "" {
		script += "rm -f \"/dev/disk/by-id/virtio-$2\"\n"
	}
	_, err := s.inGuestNamespaces(script, nil, dev, truncateSerial(serial))
	return err
}

// truncateSerial is the serial as Linux's virtio-blk shows it: at most 20 bytes.
func truncateSerial(serial string) string {
	if len(serial) > 20 {
		return serial[:20]
	}
	return serial
}

// inGuestNamespaces runs a shell script in the guest's mount and PID namespaces.
func (s *simulatedOS) inGuestNamespaces(script string, files []*os.File, args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"--target", strconv.Itoa(s.proc.Process.Pid), "--mount", "--pid", "--",
		"/bin/sh", "-c", script, "sh"}, args...)...)
	cmd.ExtraFiles = files
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("%w: %s", err, stderr)
	}
	return string(out), nil
}

package guest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// setupMounts shapes the guest OS's own mount namespace (the process starts in a copy of the
// host's). The guest gets a root of its own, as a VM has its own disk: the host's root
// filesystem seen through an overlay whose upper layer lives in the VM's run dir, so what the
// guest writes (a file under /etc, a directory it mounts over) stays in the guest and lasts
// across the VM's reboots, and the host's files are never written. /dev is the guest's own
// (the usual device nodes, bound from the host), /proc and /sys show the guest's PID and
// network namespaces, /run is the guest's own, and the guest's files are bound over their
// paths, so the guest reads its own /etc/resolv.conf, /etc/hostname and /etc/hosts. /tmp is an
// empty tmpfs of its own; of the host's own state the guest sees only its run dir.
func setupMounts(plan osPlan) error {
	// Slave rather than private: mounts made here never propagate to the host, but the host's
	// unmounts (a netns pin going away, say) still reach this copy, so the guest never keeps a
	// host mount alive.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slave: %w", err)
	}
	if err := pivotToOwnRoot(plan.RunDir); err != nil {
		return err
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	// A sysfs mounted here shows the guest's network devices (/sys/class/net), as `ip netns
	// exec` arranges it: sysfs shows those of the namespace it was mounted in.
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	if err := mountOwnRun(plan.RunDir); err != nil {
		return err
	}
	for _, f := range plan.Files {
		if err := bindFile(f); err != nil {
			return err
		}
	}
	return nil
}

// guestRootDir holds the guest's root filesystem in the VM's run dir: the overlay's mount point,
// its upper layer (what the guest wrote) and the overlay's work dir.
const guestRootDir = "guest-root"

// pivotToOwnRoot makes an overlay of the host's root filesystem the guest's root, with the
// VM's run dir bound in, and a /tmp and /dev of the guest's own.
func pivotToOwnRoot(runDir string) error {
	realRunDir, err := filepath.EvalSymlinks(runDir)
	if err != nil {
		return fmt.Errorf("resolve run dir: %w", err)
	}
	base := filepath.Join(realRunDir, guestRootDir)
	root, upper, work := filepath.Join(base, "root"), filepath.Join(base, "upper"), filepath.Join(base, "work")
	for _, dir := range []string{root, upper, work} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("guest root: %w", err)
		}
	}
	if err := ownRootHome(upper); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=/,upperdir=%s,workdir=%s", upper, work)
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount guest root (%s): %w", opts, err)
	}
	// The guest's /tmp is its own and empty, as after a boot; the run dir, wherever it lies, is
	// bound in over it.
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount guest /tmp: %w", err)
	}
	inRoot := filepath.Join(root, realRunDir)
	if err := os.MkdirAll(inRoot, 0o755); err != nil {
		return fmt.Errorf("guest root: %w", err)
	}
	if err := unix.Mount(realRunDir, inRoot, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the run dir into the guest: %w", err)
	}
	if err := populateDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; detaching it leaves the guest
	// nothing of the host but what was bound in above.
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("enter guest root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot to guest root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("let go of the host's root: %w", err)
	}
	return unix.Chdir("/")
}

// ownRootHome gives the guest a /root of its own, empty at its first boot, as an image's: an
// opaque directory in the overlay's upper layer hides the host's. Through the host's, every
// command sshd runs would read the host root's shell start-up files (bash reads ~/.bashrc when
// sshd starts it), and take whatever time they take on the host.
func ownRootHome(upper string) error {
	home := filepath.Join(upper, "root")
	if err := unix.Mkdir(home, 0o700); errors.Is(err, unix.EEXIST) {
		return nil
	} else if err != nil {
		return fmt.Errorf("guest /root: %w", err)
	}
	if err := unix.Setxattr(home, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("guest /root of its own: %w", err)
	}
	return nil
}

// populateDev gives the guest the /dev a booted Linux has: its own tmpfs, where a file made in
// /dev stays in the guest, with the host's nodes for the usual devices and the host's devpts.
func populateDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=755"); err != nil {
		return fmt.Errorf("mount guest /dev: %w", err)
	}
	for _, node := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, node)
		if err := createEmpty(target); err != nil {
			return fmt.Errorf("guest /dev/%s: %w", node, err)
		}
		if err := unix.Mount("/dev/"+node, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s into the guest: %w", node, err)
		}
	}
	for _, dir := range []string{"pts", "net"} {
		target := filepath.Join(dev, dir)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("guest /dev/%s: %w", dir, err)
		}
		if err := unix.Mount("/dev/"+dir, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind /dev/%s into the guest: %w", dir, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.MkdirAll(shm, 0o1777); err != nil {
		return fmt.Errorf("guest /dev/shm: %w", err)
	}
	if err := unix.Mount("tmpfs", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount guest /dev/shm: %w", err)
	}
	// ptmx opens the devpts above, as in a container: the PTYs it makes are the ones in /dev/pts.
	for link, dest := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(dest, filepath.Join(dev, link)); err != nil {
			return fmt.Errorf("guest /dev/%s: %w", link, err)
		}
	}
	return nil
}

// mountOwnRun gives the guest an empty /run (with sshd's privilege separation directory), as a
// booted system has. The VM's run dir stays visible even if it lies under the host's /run.
func mountOwnRun(runDir string) error {
	realRunDir, err := filepath.EvalSymlinks(runDir)
	if err != nil {
		return fmt.Errorf("resolve run dir: %w", err)
	}
	var keep *os.File
	if underRun(realRunDir) {
		if keep, err = os.OpenFile(realRunDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("hold run dir: %w", err)
		}
		defer keep.Close() //nolint:errcheck
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return fmt.Errorf("mount /run: %w", err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		return fmt.Errorf("create /run/sshd: %w", err)
	}
	if keep == nil {
		return nil
	}
	if err := os.MkdirAll(realRunDir, 0o755); err != nil {
		return fmt.Errorf("run dir in the guest's /run: %w", err)
	}
	source := fmt.Sprintf("/proc/self/fd/%d", keep.Fd())
	if err := unix.Mount(source, realRunDir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("keep run dir %s visible: %w", realRunDir, err)
	}
	return nil
}

func underRun(path string) bool {
	return path == "/run" || strings.HasPrefix(path, "/run/")
}

// bindFile binds a run-dir file (or directory) over a guest path. The host's file (or, for a symlink such as
// systemd-resolved's resolv.conf, the file it points to) is only covered, never written. A
// symlink into /run points into the guest's own /run, where the file is created; anything else
// missing on the host is left out rather than created there.
func bindFile(f guestFile) error {
	target := f.Path
	if _, err := os.Stat(target); errors.Is(err, fs.ErrNotExist) {
		dest, linkErr := os.Readlink(target)
		if linkErr != nil {
			fmt.Fprintf(os.Stderr, "guest: %s does not exist on the host; the guest has none\n", target) //nolint:errcheck
			return nil
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(target), dest)
		}
		if !underRun(dest) {
			fmt.Fprintf(os.Stderr, "guest: %s points to missing %s; the guest has none\n", target, dest) //nolint:errcheck
			return nil
		}
		if err := createEmpty(dest); err != nil {
			return fmt.Errorf("guest %s: %w", target, err)
		}
	} else if err != nil {
		return fmt.Errorf("guest %s: %w", target, err)
	}
	if err := unix.Mount(f.Source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", f.Source, target, err)
	}
	return nil
}

func createEmpty(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644) //nolint:gosec // inside the guest's own /run
	if err != nil {
		return err
	}
	return f.Close()
}

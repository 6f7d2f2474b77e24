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
// host's): nothing mounted here reaches the host, /proc and /sys show the guest's PID and network
// namespaces, /run is the guest's own, and the guest's files are bound over the host's paths, so the guest reads
// and writes its own /etc/resolv.conf, /etc/hostname and /etc/hosts while the host's stay as
// they are.
func setupMounts(plan osPlan) error {
	// Slave rather than private: mounts made here never propagate to the host, but the host's
	// unmounts (a netns pin going away, say) still reach this copy, so the guest never keeps a
	// host mount alive.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slave: %w", err)
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

package cocoonsim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/internal/nsthread"
)

// Named network namespaces, as cocoon keeps one per VM in CNI mode: a bind mount of the
// namespace on <dir>/cocoon-<VMID>, the layout of `ip netns`.
const (
	// NetnsDirEnv names the directory of the VM network namespaces. cocoon hard-codes
	// /var/run/netns; this variable exists only in the simulator, so that tests keep every
	// namespace they cause in a directory of their own.
	NetnsDirEnv     = "COCOON_SIM_NETNS_DIR"
	defaultNetnsDir = "/var/run/netns"
	// netnsPrefix marks the namespaces cocoon owns.
	netnsPrefix = "cocoon-"
)

// netnsDeleteTimeout and netnsDeleteInterval bound cocoon's retry of a netns removal, which can
// fail for a moment while the kernel releases the files of a process that was just killed.
const (
	netnsDeleteTimeout  = time.Second
	netnsDeleteInterval = 100 * time.Millisecond
)

func netnsDir() string {
	if dir := os.Getenv(NetnsDirEnv); dir != "" {
		return dir
	}
	return defaultNetnsDir
}

func netnsName(vmID string) string { return netnsPrefix + vmID }

func netnsPath(vmID string) string { return filepath.Join(netnsDir(), netnsName(vmID)) }

// createNetns creates an empty network namespace and pins it at <dir>/<name>. The file must not
// exist yet.
func createNetns(name string) error {
	dir := netnsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // same mode as ip netns and vishvananda/netns
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	path := filepath.Join(dir, name)
	err := nsthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL, 0o444) //nolint:gosec // namespace pin file
		if err != nil {
			return err
		}
		_ = f.Close()
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "bind", unix.MS_BIND, ""); err != nil {
			_ = os.Remove(path)
			return fmt.Errorf("bind %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	return nil
}

// deleteNetns unpins a named namespace, retrying briefly as cocoon does; a namespace that is
// already gone counts as deleted.
func deleteNetns(ctx context.Context, name string) error {
	path := filepath.Join(netnsDir(), name)
	return waitFor(ctx, netnsDeleteTimeout, netnsDeleteInterval, func() (bool, error) {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			err = os.Remove(path)
		}
		return err == nil || errors.Is(err, fs.ErrNotExist), nil
	})
}

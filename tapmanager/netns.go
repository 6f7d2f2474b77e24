// Package tapmanager owns the pod network: the sandbox's network namespace, and (with CNI) the
// interfaces the cluster's network plugins put in it and hand over to the VM.
package tapmanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/faultpoint"
)

// NetNSPrefix names the namespaces cocoon-cri creates, so an operator can tell them from cocoon's
// own cocoon-<VMID> namespaces.
const NetNSPrefix = "cocoon-cri-"

// NetNS makes network namespaces as bind mounts under Dir, the way ip netns does, so they live
// without any process in them.
type NetNS struct {
	Dir      string
	counters counterSockets
}

// NetNSPath is the namespace path of a sandbox.
func (n *NetNS) NetNSPath(sandboxID string) string {
	return filepath.Join(n.Dir, NetNSPrefix+sandboxID[:min(len(sandboxID), 16)])
}

// CreateNetNS makes a new network namespace and pins it at path.
func (n *NetNS) CreateNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file %s: %w", path, err)
	}
	f.Close()
	// A crash here leaves a plain file where the namespace would be (IsNetNS): with the sandbox's
	// record, its rollback's CNI DEL goes without it; without, the next start removes it.
	faultpoint.Hit("netns file created")

	errc := make(chan error, 1)
	go func() { errc <- pinNewNetNS(path) }()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("create netns %s: %w", path, err)
	}
	return nil
}

// IsNetNS reports whether path holds a network namespace: a pin that a crash cut short between
// its file and its bind mount is a plain file, which CNI plugins refuse to enter.
func IsNetNS(path string) bool {
	var st unix.Statfs_t
	return path != "" && unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// RemoveNetNS unpins and deletes the namespace at path. A missing one is fine.
func (n *NetNS) RemoveNetNS(path string) error {
	defer n.counters.closeFor(path)()
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	faultpoint.Hit("netns unmounted")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// pinNewNetNS unshares the calling thread's network namespace and bind-mounts the new one at path.
// The thread is never unlocked, so the runtime retires it rather than run other goroutines in the
// pod's namespace. It is also switched back: when the thread is the process's main thread, the
// runtime parks it instead, and /proc/self/ns/net must keep naming the host's namespace.
func pinNewNetNS(path string) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	mountErr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(mountErr, fmt.Errorf("return to the original netns: %w", err))
	}
	if mountErr != nil {
		return fmt.Errorf("bind mount: %w", mountErr)
	}
	return nil
}

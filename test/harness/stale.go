package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// The harness's temporary directories are named tempPrefix… and hold an ownerFile naming the
// process they belong to, so that a later run can tell what a killed one left (SweepStale).
const (
	tempPrefix = "ccri"
	ownerFile  = "owner"
)

// MkdirOwned makes a temporary directory tempPrefix+name… in parent (as os.MkdirTemp does: ""
// is the default) that belongs to this process: once the process is gone, SweepStale removes it and
// whatever runs from or is mounted under it.
func MkdirOwned(parent, name string) (string, error) {
	dir, err := os.MkdirTemp(parent, tempPrefix+name)
	if err != nil {
		return "", err
	}
	self, err := selfIdentity()
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, ownerFile), []byte(formatOwner(self)+"\n"), 0o644)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("record the owner of %s: %w", dir, err)
	}
	return dir, nil
}

// selfIdentity is this process's PID and start.
func selfIdentity() (vmstats.ProcessIdentity, error) {
	self := os.Getpid()
	start, err := vmstats.StartTicks("/proc", self)
	return vmstats.ProcessIdentity{PID: self, Start: start}, err
}

// formatOwner writes a process identity as the harness records owners: "PID.start".
func formatOwner(id vmstats.ProcessIdentity) string {
	return fmt.Sprintf("%d.%d", id.PID, id.Start)
}

// parseOwner reads formatOwner's form; ok is false for anything else, which is never swept.
func parseOwner(s string) (id vmstats.ProcessIdentity, ok bool) {
	pid, start, found := strings.Cut(s, ".")
	var err error
	id.PID, err = strconv.Atoi(pid)
	if !found || err != nil {
		return id, false
	}
	id.Start, err = strconv.ParseUint(start, 10, 64)
	return id, err == nil && id.PID > 0 && id.Start > 0
}

// owner reads the process a directory of MkdirOwned belongs to; ok is false for any other
// directory.
func owner(dir string) (vmstats.ProcessIdentity, bool) {
	data, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return vmstats.ProcessIdentity{}, false
	}
	return parseOwner(strings.TrimSpace(string(data)))
}

// SweepStale removes what runs that never reached their cleanups (a go test or cocoon-cluster
// killed, a machine snapshotted mid-run) left: every directory of MkdirOwned under tmp whose owner
// has ended, with the mounts under it and the processes that run from it or in a network namespace
// mounted there (killed by PID), and the warm pool cgroups they were in; and every cgroup of
// CgroupParent whose owner has ended, with what runs in it. Those of live owners, such as a test
// binary running beside this one, are left alone.
//
// A swept cluster's first node (it holds clusterDir) had the peer of the host's cluster link in its
// namespace: the kernel removes the link with the namespace, and SweepStale waits for that, so that
// the next cluster can take the link's name and routes. It returns the directories it removed.
func SweepStale(tmp string) ([]string, error) {
	return sweepStale(tmp, clusterHostLink)
}

func sweepStale(tmp, hostLink string) ([]string, error) {
	var swept []string
	var errs []error
	heldLink := false
	// A dead test's cocoon-cluster still runs, and owns its node directories: they are stale only
	// once it has been killed as a process of the test's cluster directory, so sweep again.
	for range 3 {
		stale := staleDirs(tmp)
		if len(stale) == 0 {
			break
		}
		for _, dir := range stale {
			_, err := os.Stat(filepath.Join(dir, clusterDir))
			heldLink = heldLink || err == nil
			if err := sweep(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			swept = append(swept, dir)
		}
	}
	if heldLink {
		if err := awaitLinkGone(hostLink, 30*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := sweepTestCgroups(); err != nil {
		errs = append(errs, err)
	}
	return swept, errors.Join(errs...)
}

func staleDirs(tmp string) []string {
	dirs, _ := filepath.Glob(filepath.Join(tmp, tempPrefix+"*"))
	return slices.DeleteFunc(dirs, func(dir string) bool {
		id, ok := owner(dir)
		return !ok || id.Alive("/proc")
	})
}

func sweep(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("sweep %s: %w", dir, err)
	}
	// Processes that run from the directory, and those in a network namespace mounted there: a
	// cluster's host-network pods run in a node's namespace, and name no file of the node.
	pids := ProcessesWhose(func(args string) bool {
		return strings.Contains(args, dir+"/") || strings.Contains(args, dir+"\x00")
	})
	namespaces := netnsMountedAt(mounts)
	for _, pid := range ProcessesWhose(func(string) bool { return true }) {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && slices.Contains(namespaces, ns) && !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	cgroups := poolCgroupsOf(pids)
	if left := killAll(pids, 30*time.Second); len(left) > 0 {
		return fmt.Errorf("sweep %s: processes %v outlived SIGKILL", dir, left)
	}
	if err := removeCgroups(cgroups); err != nil {
		return fmt.Errorf("sweep %s: %w", dir, err)
	}
	for _, m := range slices.Backward(mounts) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("sweep %s: unmount %s: %w", dir, m, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sweep %s: %w", dir, err)
	}
	return nil
}

// netnsMountedAt names the network namespaces of the mounts, as /proc/PID/ns/net does
// ("net:[4026532177]").
func netnsMountedAt(mounts []string) []string {
	var namespaces []string
	for _, m := range mounts {
		var st unix.Stat_t
		var fs unix.Statfs_t
		if unix.Statfs(m, &fs) == nil && fs.Type == unix.NSFS_MAGIC && unix.Stat(m, &st) == nil {
			namespaces = append(namespaces, fmt.Sprintf("net:[%d]", st.Ino))
		}
	}
	return namespaces
}

// awaitLinkGone waits until the host has no link name: a network namespace, and the veth ends in
// it, are destroyed in the background once its last mount and process are gone.
func awaitLinkGone(name string, within time.Duration) error {
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		_, err := netlink.LinkByName(name)
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the host link %s outlived the namespaces swept (%v)", name, err)
		}
	}
}

package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cocoonstack/cocoon-cri/test/stale"
)

// tempPrefix begins the names of the harness's temporary directories, which stale.MkdirOwned
// makes: a later run can tell what a killed one left (SweepStale).
const tempPrefix = "ccri"

// MkdirOwned makes a temporary directory tempPrefix+name… in parent ("" is the default) that
// belongs to this process: once the process is gone, SweepStale removes it and whatever runs from
// or is mounted under it.
func MkdirOwned(parent, name string) (string, error) {
	return stale.MkdirOwned(parent, tempPrefix+name)
}

// SweepStale removes what runs that never reached their cleanups (a go test or cocoon-cluster
// killed, a machine snapshotted mid-run) left: every directory of MkdirOwned under tmp whose owner
// has ended (stale.Remove), with the warm pool cgroups its processes were in; and every cgroup of
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
		dirs := stale.Dirs(tmp, tempPrefix)
		if len(dirs) == 0 {
			break
		}
		for _, dir := range dirs {
			_, err := os.Stat(filepath.Join(dir, clusterDir))
			heldLink = heldLink || err == nil
			var cgroups []string
			if err := stale.Remove(dir, func(pids []int) { cgroups = poolCgroupsOf(pids) }); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := removeCgroups(cgroups); err != nil {
				errs = append(errs, fmt.Errorf("sweep %s: %w", dir, err))
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

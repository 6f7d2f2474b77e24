// Package stale finds and removes what test runs killed before their cleanups left behind (CI cut
// short, a machine snapshotted mid-run, a kill -9): a run's temporary directories record the
// process that owns them (MkdirOwned), and once that process has ended, Remove kills what runs from
// a directory or in a network namespace mounted under it, undoes its mounts and deletes it. What
// live processes own is never touched.
package stale

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// ownerFile, in a directory of MkdirOwned, names the process it belongs to.
const ownerFile = "owner"

// MkdirOwned makes a temporary directory as os.MkdirTemp(parent, pattern) does, that belongs to
// this process: once the process is gone, Dirs finds it.
func MkdirOwned(parent, pattern string) (string, error) {
	dir, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		return "", err
	}
	self, err := Self()
	if err == nil {
		err = WriteOwner(dir, self)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// WriteOwner records owner as the process dir belongs to.
func WriteOwner(dir string, owner vmstats.ProcessIdentity) error {
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(FormatOwner(owner)+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the owner of %s: %w", dir, err)
	}
	return nil
}

// Self is this process's PID and start.
func Self() (vmstats.ProcessIdentity, error) {
	self := os.Getpid()
	start, err := vmstats.StartTicks("/proc", self)
	return vmstats.ProcessIdentity{PID: self, Start: start}, err
}

// FormatOwner writes a process identity as owners are recorded: "PID.start".
func FormatOwner(id vmstats.ProcessIdentity) string {
	return fmt.Sprintf("%d.%d", id.PID, id.Start)
}

// ParseOwner reads FormatOwner's form; ok is false for anything else, which is never taken for
// stale.
func ParseOwner(s string) (id vmstats.ProcessIdentity, ok bool) {
	pid, start, found := strings.Cut(s, ".")
	var err error
	id.PID, err = strconv.Atoi(pid)
	if !found || err != nil {
		return id, false
	}
	id.Start, err = strconv.ParseUint(start, 10, 64)
	return id, err == nil && id.PID > 0 && id.Start > 0
}

// Dirs lists the directories of MkdirOwned under tmp whose names begin with prefix and whose
// owners have ended.
func Dirs(tmp, prefix string) []string {
	dirs, _ := filepath.Glob(filepath.Join(tmp, prefix+"*"))
	return slices.DeleteFunc(dirs, func(dir string) bool {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			return true
		}
		id, ok := ParseOwner(strings.TrimSpace(string(data)))
		return !ok || id.Alive("/proc")
	})
}

// Remove removes a stale directory: it kills, by PID, the processes whose command line names it
// and those in a network namespace mounted under it (a host-network pod names no file of its
// node), undoes the mounts under it and deletes it. found, when not nil, sees the processes before
// they are killed.
func Remove(dir string, found func(pids []int)) error {
	mounts, err := MountsUnder(dir)
	if err != nil {
		return fmt.Errorf("sweep %s: %w", dir, err)
	}
	pids := ProcessesWhose(func(args string) bool {
		return strings.Contains(args, dir+"/") || strings.Contains(args, dir+"\x00")
	})
	namespaces := netnsMountedAt(mounts)
	for _, pid := range ProcessesWhose(func(string) bool { return true }) {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && slices.Contains(namespaces, ns) && !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	if found != nil {
		found(pids)
	}
	if left := KillAll(pids, 30*time.Second); len(left) > 0 {
		return fmt.Errorf("sweep %s: processes %v outlived SIGKILL", dir, left)
	}
	if err := Unmount(mounts); err != nil {
		return fmt.Errorf("sweep %s: %w", dir, err)
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

// KillAll sends SIGKILL to pids and waits, at most within, until they have ended; it returns
// those that have not.
func KillAll(pids []int, within time.Duration) []int {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	left := slices.Clone(pids)
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		left = slices.DeleteFunc(left, func(pid int) bool { return !testproc.Running(pid) })
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}

// Unmount detaches mounts (as MountsUnder lists them), the last mounted first; one already gone is
// fine.
func Unmount(mounts []string) error {
	var errs []error
	for _, m := range slices.Backward(mounts) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points below dir, in the order they were mounted.
func MountsUnder(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !strings.HasPrefix(m.Mountpoint, dir+"/"), false
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(infos))
	for i, m := range infos {
		out[i] = m.Mountpoint
	}
	return out, nil
}

// ProcessesWhose lists the PIDs of the live processes whose command line (arguments joined by
// NULs) matches.
func ProcessesWhose(match func(cmdline string) bool) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if match(string(cmdline)) && testproc.Running(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

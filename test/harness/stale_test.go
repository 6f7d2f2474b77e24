package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/tapmanager"
	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestSweepStaleRemovesWhatKilledRunsLeft: a directory whose owner has ended goes, with the process
// that runs from it, the mounts under it, the process in the namespace mounted there and, with the
// namespace, the host link of the cluster it held; so does a test cgroup whose owner has ended,
// with the process in it. A live owner's directory and cgroup, and a directory without an owner,
// stay.
func TestSweepStaleRemovesWhatKilledRunsLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts, network namespaces")
	}
	tmp := t.TempDir()

	live, err := MkdirOwned(tmp, "-live")
	if err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(tmp, tempPrefix+"-no-owner")
	if err := os.Mkdir(foreign, 0o700); err != nil {
		t.Fatal(err)
	}

	dead := ownedByEndedProcess(t, tmp, "-dead")
	reused := filepath.Join(tmp, tempPrefix+"-reused")
	if err := os.Mkdir(reused, 0o700); err != nil {
		t.Fatal(err)
	}
	// This process's PID with another start: its PID given to a later process.
	if err := stale.WriteOwner(reused, vmstats.ProcessIdentity{PID: os.Getpid(), Start: 1}); err != nil {
		t.Fatal(err)
	}

	// What the dead run left: a process started from its directory, a mount, and a cluster's node
	// namespace holding the peer of a host link.
	left := startBlocked(t, nil, "sh", "-c", "read never", filepath.Join(dead, "daemon"))
	mnt := filepath.Join(dead, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := os.Mkdir(filepath.Join(dead, clusterDir), 0o700); err != nil {
		t.Fatal(err)
	}
	nodeNS := filepath.Join(dead, "netns")
	if err := (&tapmanager.NetNS{}).CreateNetNS(nodeNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = (&tapmanager.NetNS{}).RemoveNetNS(nodeNS) })
	link := hostLinkInto(t, nodeNS)
	// A host-network pod's process: it names no file of the node (the namespace is passed as an
	// open file), and holds the namespace.
	nsFile, err := os.Open(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	inNamespace := startBlocked(t, []*os.File{nsFile}, "nsenter", "--net=/proc/self/fd/3", "sh", "-c", "read never")
	nsFile.Close()

	// A test cgroup of the dead run, with a process in a cgroup below it; and one of this process.
	staleCgroup := "/" + testCgroupPrefix + stale.FormatOwner(endedProcess(t)) + "-sweep"
	MakeCgroup(t, staleCgroup)
	MakeCgroup(t, staleCgroup+"/pod")
	t.Cleanup(func() { _ = removeCgroupTree(staleCgroup) })
	inCgroup := startBlocked(t, nil, "sh", "-c", "read never")
	if err := os.WriteFile(filepath.Join(CgroupDirs(staleCgroup + "/pod")[0], "cgroup.procs"), []byte(strconv.Itoa(inCgroup.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	liveCgroup := CgroupParent(t)
	MakeCgroup(t, liveCgroup)

	swept, err := sweepStale(tmp, link)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(swept)
	if want := []string{dead, reused}; !slices.Equal(swept, want) {
		t.Errorf("swept %v, want %v", swept, want)
	}
	for _, gone := range []string{dead, reused} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", gone, err)
		}
	}
	for _, kept := range []string{live, foreign} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
	if testproc.Running(left.Process.Pid) {
		t.Errorf("the process running from the dead run's directory (PID %d) still runs", left.Process.Pid)
	}
	if testproc.Running(inNamespace.Process.Pid) {
		t.Errorf("the process in the dead run's node namespace (PID %d) still runs", inNamespace.Process.Pid)
	}
	if testproc.Running(inCgroup.Process.Pid) {
		t.Errorf("the process in the dead run's cgroup (PID %d) still runs", inCgroup.Process.Pid)
	}
	if dirs := CgroupDirs(staleCgroup); len(dirs) > 0 {
		t.Errorf("the dead run's cgroup is still there: %v", dirs)
	}
	if len(CgroupDirs(liveCgroup)) == 0 {
		t.Errorf("the sweep removed this run's cgroup %s", liveCgroup)
	}
	if mounts, _ := stale.MountsUnder(dead); len(mounts) > 0 {
		t.Errorf("mounts left under the dead run's directory: %v", mounts)
	}
	if _, err := netlink.LinkByName(link); err == nil {
		t.Errorf("the host link %s outlived the swept namespace", link)
	}

	// Nothing stale is left: a second sweep removes nothing.
	if swept, err := sweepStale(tmp, link); err != nil || len(swept) > 0 {
		t.Errorf("a second sweep: %v, %v", swept, err)
	}
}

// startBlocked starts a command that waits on its stdin, with files from fd 3 on, and kills it
// when the test ends.
func startBlocked(t *testing.T, files []*os.File, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.ExtraFiles = files
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = stdin.Close()
	})
	return cmd
}

// ownedByEndedProcess makes a directory of MkdirOwned's form whose owner was a process that has
// ended.
func ownedByEndedProcess(t *testing.T, parent, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, tempPrefix+name)
	if err != nil {
		t.Fatal(err)
	}
	if err := stale.WriteOwner(dir, endedProcess(t)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// endedProcess is the identity of a process that ran and has ended.
func endedProcess(t *testing.T) vmstats.ProcessIdentity {
	t.Helper()
	ended := exec.Command("sleep", "60")
	if err := ended.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := vmstats.StartTicks("/proc", ended.Process.Pid)
	_ = ended.Process.Kill()
	_ = ended.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return vmstats.ProcessIdentity{PID: ended.Process.Pid, Start: start}
}

// hostLinkInto makes a veth pair with a name of its own on the host and its peer in the namespace
// at nsPath, as a cluster's host link, and returns the host end's name.
func hostLinkInto(t *testing.T, nsPath string) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "ccri-sw" + hex.EncodeToString(b)
	ns, err := os.Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return name
}

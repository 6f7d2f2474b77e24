package harness

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// Virtiofsds lists the PIDs of the virtiofsd processes serving this node's shares.
func (n *Node) Virtiofsds() []int {
	return ProcessesWhose(func(args string) bool {
		return strings.Contains(args, "virtiofsd") && strings.Contains(args, n.StateDir+"/shares/")
	})
}

// killCocoonProcesses kills, by PID, whatever of cocoon's still runs for the node once its guests
// are stopped: a hypervisor whose clone the daemon's stop cut short before cocoon recorded its
// PID, a cocoon command the daemon left. The node's next start would have reconciled them; a test
// has none.
func (n *Node) killCocoonProcesses() {
	left := ProcessesWhose(func(args string) bool {
		return strings.Contains(args, n.RunDir+"/") || strings.Contains(args, n.RunDir+"\x00")
	})
	if len(left) == 0 {
		return
	}
	n.T.Logf("killing cocoon processes left by the node: %v", left)
	if left = killAll(left, 30*time.Second); len(left) > 0 {
		n.T.Errorf("cocoon processes %v outlived SIGKILL", left)
	}
}

// killAll sends SIGKILL to pids and waits, at most within, until they have ended; it returns
// those that have not.
func killAll(pids []int, within time.Duration) []int {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	left := slices.Clone(pids)
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		left = slices.DeleteFunc(left, func(pid int) bool { return !testproc.Running(pid) })
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}

// MountsUnder lists the mount points below dir, in the order they were mounted.
func MountsUnder(t testproc.TB, dir string) []string {
	mounts, err := mountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return mounts
}

func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
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

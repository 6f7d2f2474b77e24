package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// Virtiofsds lists the PIDs of the virtiofsd processes serving this node's shares.
func (n *Node) Virtiofsds() []int {
	return ProcessesWhose(func(args string) bool {
		return strings.Contains(args, "virtiofsd") && strings.Contains(args, n.StateDir+"/shares/")
	})
}

// MountsUnder lists the mount points below dir, in the order they were mounted.
func MountsUnder(t testproc.TB, dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
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

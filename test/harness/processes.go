package harness

import (
	"strings"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/stale"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// Virtiofsds lists the PIDs of the virtiofsd processes serving this node's shares.
func (n *Node) Virtiofsds() []int {
	return stale.ProcessesWhose(func(args string) bool {
		return strings.Contains(args, "virtiofsd") && strings.Contains(args, n.StateDir+"/shares/")
	})
}

// killCocoonProcesses kills, by PID, whatever of cocoon's still runs for the node once its guests
// are stopped: a hypervisor whose clone the daemon's stop cut short before cocoon recorded its
// PID, a cocoon command the daemon left. The node's next start would have reconciled them; a test
// has none.
func (n *Node) killCocoonProcesses() {
	left := stale.ProcessesWhose(func(args string) bool {
		return strings.Contains(args, n.RunDir+"/") || strings.Contains(args, n.RunDir+"\x00")
	})
	if len(left) == 0 {
		return
	}
	n.T.Logf("killing cocoon processes left by the node: %v", left)
	if left = stale.KillAll(left, 30*time.Second); len(left) > 0 {
		n.T.Errorf("cocoon processes %v outlived SIGKILL", left)
	}
}

// MountsUnder lists the mount points below dir, in the order they were mounted.
func MountsUnder(t testproc.TB, dir string) []string {
	mounts, err := stale.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return mounts
}

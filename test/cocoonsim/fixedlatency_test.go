package cocoonsim_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim/guest"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// The benchmark mode: a clone takes the fixed latency at least, and its VM runs no guest. The
// hypervisor has no guest process under it, every command "runs" at once with exit 0 and no
// output, and poweroff powers the VM off as a guest would.
func TestFixedLatencyMode(t *testing.T) {
	s := newSim(t)
	const latency = 300 * time.Millisecond
	s.env = append(s.env, guest.FixedLatencyEnv+"="+latency.String())
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})

	start := time.Now()
	vm := s.clone("base", "fast")
	if took := time.Since(start); took < latency {
		t.Fatalf("a clone in the benchmark mode took %v, want at least %v", took, latency)
	}
	if vm.PID <= 0 || !testproc.Running(vm.PID) {
		t.Fatalf("the clone's hypervisor is not running: %+v", vm)
	}
	if kids := childrenOf(t, vm.PID); len(kids) > 0 {
		t.Fatalf("the hypervisor runs a guest (children %v): the benchmark mode has none", kids)
	}
	if out := s.ok("vm", "exec", "fast", "--", "sh", "-c", "echo ran; exit 3"); out != "" {
		t.Fatalf("a command in the null guest printed %q: nothing runs there", out)
	}
	s.ok("vm", "exec", "fast", "--", "poweroff")
	eventually(t, "the hypervisor to end after poweroff", func() bool { return !testproc.Running(vm.PID) })
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := vmstats.ReadStat("/proc", child); err == nil && st.PPID == pid {
			kids = append(kids, child)
		}
	}
	return kids
}

package e2e

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

// TestUnreapedHypervisorIsCrashed: on a node whose init does not reap, a killed hypervisor stays
// a zombie and cocoon keeps calling its VM running. cocoon-cri still sees the crash, while it runs
// and across its own restart, on both cocoon releases; the pods then go without leaving the zombie.
func TestUnreapedHypervisorIsCrashed(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"0.3.8", "0.5.1"} {
		t.Run(version, func(t *testing.T) {
			n := newNodeWithEnv(t, []string{cocoonsim.VersionEnv + "=" + version, cocoonsim.NoReapEnv + "=1"})
			n.withSnapshot()
			live, liveCtr, _ := n.runningPod("live", snapRef)
			down, downCtr, _ := n.runningPod("down", snapRef)

			livePID := n.vmPID(liveCtr)
			n.killToZombie(livePID)
			vmID, _ := field(n.inspect("inspect", liveCtr), "info", "vm", "id").(string)
			if vm, err := n.vm(vmID); err != nil || vm.State != cocoon.VMStateRunning {
				t.Fatalf("cocoon vm inspect of the zombie's VM: %+v, %v; want running (kill(pid, 0) succeeds)", vm, err)
			}
			n.checkCrashed(n.waitExited(liveCtr), livePID)

			downPID := n.vmPID(downCtr)
			n.Kill()
			n.killToZombie(downPID)
			n.Start()
			st := n.inspect("inspect", downCtr)["status"].(map[string]any)
			if st["state"] != "CONTAINER_EXITED" {
				t.Fatalf("after a restart, the container whose hypervisor is a zombie: %v", st)
			}
			n.checkCrashed(st, downPID)

			for _, pod := range []string{live, down} {
				n.mustCrictl("stopp", pod)
				n.mustCrictl("rmp", pod)
			}
			for _, pid := range []int{livePID, downPID} {
				deadline := time.Now().Add(10 * time.Second)
				for testproc.State(pid) != "" {
					if time.Now().After(deadline) {
						t.Fatalf("hypervisor %d is still there (state %s) after its pod was removed", pid, testproc.State(pid))
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// killToZombie SIGKILLs a hypervisor and waits until it is an unreaped zombie.
func (n *node) killToZombie(pid int) {
	n.t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		n.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testproc.State(pid) != "Z" {
		if time.Now().After(deadline) {
			n.t.Fatalf("hypervisor %d: state %q, want a zombie", pid, testproc.State(pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkCrashed checks a container status says its hypervisor crashed and was never reaped.
func (n *node) checkCrashed(st map[string]any, pid int) {
	n.t.Helper()
	msg, _ := st["message"].(string)
	if st["reason"] != "VMCrashed" || st["exitCode"] != float64(137) || !strings.Contains(msg, "PID "+strconv.Itoa(pid)) || !strings.Contains(msg, "nothing reaped it") {
		n.t.Fatalf("container status %v: want reason VMCrashed, exit code 137 and a message naming unreaped PID %d", st, pid)
	}
}

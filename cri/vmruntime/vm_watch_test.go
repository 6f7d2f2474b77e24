package vmruntime

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/pkg/keylock"
	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/pkg/vmstats"
)

// A hypervisor is recognised by its PID and start time: a live process that holds the recorded
// PID but started at another time (the PID was reused) is not the container's VM.
func TestHypervisorAliveTellsAReusedPID(t *testing.T) {
	pid := os.Getpid()
	start, err := vmstats.StartTicks(procRoot, pid)
	if err != nil {
		t.Fatal(err)
	}
	if !hypervisorProcess(pid, store.VM{PID: pid, PIDStart: start}).Alive(procRoot) {
		t.Fatal("the recorded process itself is not alive")
	}
	if hypervisorProcess(pid, store.VM{PID: pid, PIDStart: start + 1}).Alive(procRoot) {
		t.Fatal("a process that reuses the recorded PID is taken for the VM")
	}
	if !hypervisorProcess(pid, store.VM{PID: pid}).Alive(procRoot) {
		t.Fatal("a record without a start time (an older record) makes a live VM dead")
	}
	// PID 1 stands for a live process cocoon started anew.
	if !hypervisorProcess(1, store.VM{PID: pid, PIDStart: start + 1}).Alive(procRoot) {
		t.Fatal("a hypervisor cocoon started anew (another PID) is judged by the old one's start time")
	}
}

// waitVMGone returns when the hypervisor exits, zombie or reaped, and not before; a hypervisor
// that goes on running holds it until its context ends.
func TestWaitVMGone(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := vmstats.StartTicks(procRoot, pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := hypervisorProcess(pid, store.VM{PID: pid, PIDStart: start})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitVMGone(ctx, rec); !errors.Is(err, context.Canceled) {
		t.Fatalf("a running hypervisor, the wait cancelled: %v, want the context's error", err)
	}
	if err := waitVMGone(context.Background(), hypervisorProcess(pid, store.VM{PID: pid, PIDStart: start + 1})); err != nil {
		t.Fatalf("a PID reused by another process: %v, want the VM gone", err)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 3*vmGonePoll)
	defer cancelShort()
	if err := waitVMGone(short, rec); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a running hypervisor: %v, want the wait to last until its deadline", err)
	}

	done := make(chan error, 1)
	go func() { done <- waitVMGone(context.Background(), rec) }()
	// Killed and left a zombie (not reaped): gone.
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the hypervisor was killed: %v", err)
	}
	if err := waitVMGone(context.Background(), rec); err != nil {
		t.Fatalf("a zombie hypervisor: %v", err)
	}
}

// The watcher alone, over the fake cocoon: what it makes of a running container's VM that cocoon
// reports stopped, removed, stale (a second look first) or running with a dead hypervisor.
func TestVMWatcherTellsHowAVMEnded(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Sandboxes.Create(&store.Sandbox{ID: "pod", Name: "pod", State: store.SandboxReady}); err != nil {
		t.Fatal(err)
	}
	fc := newFakeCocoon()
	var exits []string
	var reclaimed []string
	w := &vmWatcher{log: slog.New(slog.DiscardHandler), store: st, locks: &keylock.Map{}, cocoon: fc,
		recordExit: func(c *store.Container, e exitStatus) error {
			exits = append(exits, c.ID+" "+e.reason)
			return nil
		},
		reclaimLostVM: func(_ *store.Sandbox, c *store.Container) error {
			reclaimed = append(reclaimed, c.ID)
			return nil
		},
	}
	for _, tc := range []struct {
		name, state string
		settled     bool
		want        string // the exit recorded, "" for none
		again       bool
	}{
		{"stopped", string(cocoon.VMStateStopped), false, "stopped VMStopped", false},
		{"removed", "", false, "removed " + reasonVMGone, false},
		{"stale", string(cocoon.VMStateStale), false, "", true},
		{"stale-settled", string(cocoon.VMStateStale), true, "stale-settled VMCrashed", false},
		{"dead-hypervisor", string(cocoon.VMStateRunning), false, "", true},
		{"dead-hypervisor-settled", string(cocoon.VMStateRunning), true, "dead-hypervisor-settled VMCrashed", false},
	} {
		exits = nil
		vm := fc.addVM(cocoon.VM{State: cocoon.VMStateRunning, PID: fakeDeadPIDs})
		// A running VM keeps its hypervisor PID, which no process has.
		if tc.state == "" {
			fc.forgetVM(vm.ID)
		} else {
			fc.setVMState(vm.ID, cocoon.VMState(tc.state))
		}
		c := &store.Container{ID: tc.name, Name: tc.name, SandboxID: "pod", State: store.ContainerRunning, VM: store.VM{ID: vm.ID, PID: fakeDeadPIDs}}
		if err := st.Containers.Create(c); err != nil {
			t.Fatal(err)
		}
		again := w.checkVMEndedOnce(ctx, "pod", c.ID, vm.ID, tc.settled)
		if got := strings.Join(exits, ","); got != tc.want || again != tc.again {
			t.Errorf("%s: recorded %q, again %v; want %q, again %v", tc.name, got, again, tc.want, tc.again)
		}
	}
	if len(reclaimed) != 1 || reclaimed[0] != "removed" {
		t.Errorf("the pod interface was taken back from %v, want only from the VM cocoon lost", reclaimed)
	}
}

// A command (or the guest's set-up before it) that fails because its VM ended under it leaves
// the container to the VM watcher, which records how the VM ended: a crash is VMCrashed, not the
// exec's error. One that fails while its VM runs ends the container with GuestExecError.
func TestACommandFailedByItsVMsEndLeavesTheEndToTheWatcher(t *testing.T) {
	ctx := context.Background()
	n := newFakeNode(t, Config{})
	pid, _ := hypervisorStandIn(t)
	n.cocoon.setPID(func() int { return pid })
	_, alive := n.runningPod("alive")
	n.cocoon.setPID(func() int { return fakeDeadPIDs }) // a hypervisor that has ended
	crashedSandbox, crashed := n.runningPod("crashed")
	execErr := errors.New("exec: agent: connection closed before exit frame")

	n.s.mainExited(ctx, crashedSandbox, crashed, 0, execErr)
	if c := n.container(crashed); c.State != store.ContainerRunning {
		t.Fatalf("a command failed by its VM's end was recorded itself: %s %s", c.State, c.Reason)
	}
	n.s.watcher.checkVMEndedOnce(ctx, crashedSandbox, crashed, n.container(crashed).VM.ID, true)
	if c := n.container(crashed); c.State != store.ContainerExited || c.Reason != reasonVMCrashed || c.ExitCode != killedExitCode {
		t.Fatalf("the container of a crashed VM: %s %s %d, want EXITED %s %d", c.State, c.Reason, c.ExitCode, reasonVMCrashed, killedExitCode)
	}

	n.s.mainExited(ctx, n.container(alive).SandboxID, alive, 0, execErr)
	if c := n.container(alive); c.State != store.ContainerExited || c.Reason != reasonGuestExecError || c.ExitCode != startErrorExitCode {
		t.Fatalf("a command that failed in a running VM: %s %s %d", c.State, c.Reason, c.ExitCode)
	}
}

package vmruntime

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

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

package vmstats

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRunningZombie: a process that has exited and waits to be reaped is not alive, although
// kill(pid, 0) still succeeds on it.
func TestRunningZombie(t *testing.T) {
	if !Running("/proc", os.Getpid()) {
		t.Fatal("this test's own process is not alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Wait() })
	// Wait for the exit without reaping it: the child stays a zombie.
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			t.Fatal(err)
		}
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("kill(%d, 0) of a zombie: %v, want success", pid, err)
	}
	if Running("/proc", pid) {
		t.Fatalf("Running(%d) of a zombie: true", pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if Running("/proc", pid) {
		t.Fatalf("Running(%d) of a reaped process: true", pid)
	}
	if Running("/proc", 0) || Running("/proc", -1) {
		t.Fatal("Running of a non-PID: true")
	}
}

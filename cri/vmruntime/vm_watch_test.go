package vmruntime

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProcessAliveZombie: a process that has exited and waits to be reaped is not alive, although
// kill(pid, 0) still succeeds on it.
func TestProcessAliveZombie(t *testing.T) {
	if !processAlive(os.Getpid()) {
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
	if processAlive(pid) {
		t.Fatalf("processAlive(%d) of a zombie: true", pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Fatalf("processAlive(%d) of a reaped process: true", pid)
	}
	if processAlive(0) || processAlive(-1) {
		t.Fatal("processAlive of a non-PID: true")
	}
}

package testproc

import (
	"bufio"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func start(t *testing.T, script string) *Process {
	t.Helper()
	p, err := Start(exec.Command("sh", "-c", script))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func TestStopEndsAProcessThatHonoursSIGTERM(t *testing.T) {
	p := start(t, "exec sleep 600")
	clean, err := p.Stop(time.Minute)
	if !clean || err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("Stop: clean %t, %v; want a clean end by SIGTERM", clean, err)
	}
}

// A process that ignores SIGTERM is killed once the grace period has passed.
func TestStopKillsAProcessThatIgnoresSIGTERM(t *testing.T) {
	cmd := exec.Command("sh", "-c", "trap '' TERM; echo ignoring; exec sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	// SIGTERM only once the shell ignores it.
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	clean, err := p.Stop(100 * time.Millisecond)
	if clean || err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop: clean %t, %v; want SIGKILL", clean, err)
	}
	if !p.Exited(0) {
		t.Fatal("Done is not closed after Stop")
	}
}

func TestWaitReady(t *testing.T) {
	p := start(t, "exec sleep 600")
	calls := 0
	err := p.WaitReady(time.Minute, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("WaitReady: %v after %d calls", err, calls)
	}

	gone := start(t, "exit 3")
	err = gone.WaitReady(time.Hour, time.Millisecond, func() error { return errors.New("never ready") })
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("WaitReady of a process that exits: %v", err)
	}
	if err := p.WaitReady(0, time.Millisecond, func() error { return errors.New("never ready") }); err == nil ||
		!strings.Contains(err.Error(), "never ready") {
		t.Fatalf("WaitReady past its timeout: %v", err)
	}
}

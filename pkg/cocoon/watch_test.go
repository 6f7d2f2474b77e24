package cocoon

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/test/testproc"
)

func TestWatchVMsHandsOverEventsInOrder(t *testing.T) {
	// Contract section 1.6: one {"event","vm"} object per line, the VM's state reconciled.
	stale := strings.Replace(strings.ReplaceAll(vmJSON, "%PID%", "4242"), `"running"`, `"stopped (stale)"`, 1)
	c, dir := fakeCocoon(t, response{match: "vm status", stdout: `{"event":"ADDED","vm":` + strings.ReplaceAll(vmJSON, "%PID%", "4242") + "}\n" +
		`{"event":"MODIFIED","vm":` + stale + "}\n" + `{"event":"DELETED","vm":` + stale + "}\n"})
	var got []string
	err := c.WatchVMs(context.Background(), 1500*time.Millisecond, func(ev VMEvent) {
		got = append(got, string(ev.Event)+" "+ev.VM.ID+" "+string(ev.VM.State))
	})
	if err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("WatchVMs after cocoon exited: %v", err)
	}
	want := []string{"ADDED 2RZK3AEDFZUFVHF6YX3YHQPH75 running", "MODIFIED 2RZK3AEDFZUFVHF6YX3YHQPH75 stopped (stale)", "DELETED 2RZK3AEDFZUFVHF6YX3YHQPH75 stopped (stale)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events %q, want %q", got, want)
	}
	if argv := calls(t, dir)[0]; !strings.HasSuffix(argv, "vm status --event --format json -n 1") {
		t.Fatalf("argv %q", argv)
	}
}

func TestWatchVMsStopsAtALineItCannotRead(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "vm status", stdout: "EVENT\tID\tNAME\n"})
	calls := 0
	err := c.WatchVMs(context.Background(), time.Second, func(VMEvent) { calls++ })
	if err == nil || !strings.Contains(err.Error(), "unexpected line") || calls != 0 {
		t.Fatalf("WatchVMs over text output: %v after %d events", err, calls)
	}
}

func TestWatchVMsEndsWithItsContext(t *testing.T) {
	c, _ := fakeCocoon(t, response{match: "vm status", sleep: "30"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.WatchVMs(ctx, time.Second, func(VMEvent) {}) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchVMs after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("WatchVMs outlived its context")
	}
}

// The stream's parent-death signal belongs to the OS thread that started it. Code that retires
// its thread (a locked goroutine that ends, as the netns set-up does) must not take the stream
// with it.
func TestWatchVMsOutlivesRetiredThreads(t *testing.T) {
	c, dir := fakeCocoon(t, response{match: "vm status", sleep: "30"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.WatchVMs(ctx, time.Second, func(VMEvent) {}) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "child.pid")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fake cocoon vm status never started")
		}
	}
	// Goroutines that hold their threads while they wait use up the idle ones, the stream's
	// starter among them; all of those threads end with them.
	var ready sync.WaitGroup
	release := make(chan struct{})
	for range 64 {
		ready.Add(1)
		go func() {
			runtime.LockOSThread()
			ready.Done()
			<-release
		}()
	}
	ready.Wait()
	close(release)
	shell, err := os.ReadFile(filepath.Join(dir, "shell.pid"))
	if err != nil {
		t.Fatal(err)
	}
	// Killed, the fake stays a zombie: its sleeping child holds the pipe, so no one reaps it yet.
	time.Sleep(100 * time.Millisecond)
	pid, err := strconv.Atoi(strings.TrimSpace(string(shell)))
	if err != nil {
		t.Fatal(err)
	}
	if state := testproc.State(pid); state != "S" {
		t.Fatalf("the stream's process is in state %q after other goroutines retired their threads, want S (alive, waiting)", state)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchVMs after cancel: %v", err)
	}
}

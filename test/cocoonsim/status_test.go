package cocoonsim_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/testimage"
)

// statusStream runs `vm status --event --format json` and delivers its events.
type statusStream struct {
	t      *testing.T
	cmd    *exec.Cmd
	events chan cocoon.Event
	done   chan error
}

func (s *sim) statusEvents(args ...string) *statusStream {
	s.t.Helper()
	cmd := exec.Command(simBinary, append(append(s.globalFlags(), "vm", "status", "--event", "--format", "json"), args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	st := &statusStream{t: s.t, cmd: cmd, events: make(chan cocoon.Event, 64), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev cocoon.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				st.done <- err
				return
			}
			st.events <- ev
		}
		st.done <- cmd.Wait()
	}()
	s.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return st
}

// next waits for the next event of vmID matching want and fails on a timeout or a wrong kind.
func (st *statusStream) next(vmID, wantEvent string, wantState cocoon.VMState) cocoon.Event {
	st.t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case ev := <-st.events:
			if ev.VM.ID != vmID {
				continue
			}
			if ev.Event != wantEvent || ev.VM.State != wantState {
				st.t.Fatalf("event for %s: got %s/%s, want %s/%s", vmID, ev.Event, ev.VM.State, wantEvent, wantState)
			}
			return ev
		case err := <-st.done:
			st.t.Fatalf("status stream ended early: %v", err)
		case <-timeout:
			st.t.Fatalf("no %s event for %s", wantEvent, vmID)
		}
	}
}

func TestStatusEventStream(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	existing := s.clone("base", "existing")

	st := s.statusEvents("-n", "1")
	st.next(existing.ID, cocoon.EventAdded, cocoon.VMStateRunning)

	added := s.clone("base", "added")
	ev := st.next(added.ID, cocoon.EventAdded, cocoon.VMStateRunning)
	if ev.VM.Config.Name != "added" || ev.VM.Hypervisor != cocoon.HypervisorCloudHypervisor {
		t.Fatalf("ADDED payload: %+v", ev.VM)
	}

	// A crash changes nothing on disk: it shows at the next liveness tick as "stopped (stale)".
	if err := syscall.Kill(existing.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st.next(existing.ID, cocoon.EventModified, cocoon.VMStateStale)

	s.ok("vm", "stop", "added")
	st.next(added.ID, cocoon.EventModified, cocoon.VMStateStopped)
	s.ok("vm", "rm", "added")
	deleted := st.next(added.ID, cocoon.EventDeleted, cocoon.VMStateStopped)
	if deleted.VM.Config.Name != "added" {
		t.Fatalf("DELETED carries the last record: %+v", deleted.VM)
	}

	// SIGINT ends the stream cleanly.
	_ = st.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-st.done:
		if err != nil {
			t.Fatalf("status exit: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("status did not exit on SIGINT")
	}
}

func TestStatusFiltersAndTextHeader(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	a := s.clone("base", "alpha")
	s.clone("base", "beta")
	st := s.statusEvents("alpha")
	st.next(a.ID, cocoon.EventAdded, cocoon.VMStateRunning)
	select {
	case ev := <-st.events:
		t.Fatalf("filtered stream emitted %s for %s", ev.Event, ev.VM.Config.Name)
	case <-time.After(500 * time.Millisecond):
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	text := exec.CommandContext(ctx, simBinary, append(s.globalFlags(), "vm", "status", "--event")...)
	stdout, _ := text.StdoutPipe()
	if err := text.Start(); err != nil {
		t.Fatal(err)
	}
	header, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || header != "EVENT\tID\tNAME\tSTATE\tCPU\tMEMORY\tIP\tIMAGE\n" {
		t.Fatalf("text event header %q: %v", header, err)
	}
	cancel()
	_ = text.Wait()
}

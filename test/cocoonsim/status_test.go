package cocoonsim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-cri/pkg/cocoon"
	"github.com/cocoonstack/cocoon-cri/test/cocoonsim"
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

// change is one event of a VM as the stream reports it.
type change struct {
	event string
	state cocoon.VMState
}

// event waits for the next event of the VM whose ID or name is vmRef.
func (st *statusStream) event(vmRef string) cocoon.Event {
	st.t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case ev := <-st.events:
			if ev.VM.ID == vmRef || ev.VM.Config.Name == vmRef {
				return ev
			}
		case err := <-st.done:
			st.t.Fatalf("status stream ended early: %v", err)
		case <-timeout:
			st.t.Fatalf("no event for %s", vmRef)
		}
	}
}

// next waits for vmID's next event and fails unless it is want.
func (st *statusStream) next(vmRef string, want change) cocoon.Event {
	st.t.Helper()
	ev := st.event(vmRef)
	if got := (change{ev.Event, ev.VM.State}); got != want {
		st.t.Fatalf("event for %s: got %s/%s, want %s/%s", vmRef, got.event, got.state, want.event, want.state)
	}
	return ev
}

func TestStatusEventStream(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	existing := s.clone("base", "existing")

	st := s.statusEvents("-n", "1")
	st.next(existing.ID, change{cocoon.EventAdded, cocoon.VMStateRunning})

	// The clone shows as ADDED/running, or as ADDED/creating and then MODIFIED/running: the stream
	// compares snapshots of cocoon's DB taken on fsnotify and poll ticks, and one may land while
	// the clone's "creating" placeholder is still there.
	added := s.clone("base", "added")
	ev := st.event(added.ID)
	switch (change{ev.Event, ev.VM.State}) {
	case change{cocoon.EventAdded, cocoon.VMStateCreating}:
		ev = st.next(added.ID, change{cocoon.EventModified, cocoon.VMStateRunning})
	case change{cocoon.EventAdded, cocoon.VMStateRunning}:
	default:
		t.Fatalf("first event for %s: got %s/%s, want ADDED/running or ADDED/creating", added.ID, ev.Event, ev.VM.State)
	}
	if ev.VM.Config.Name != "added" || ev.VM.Hypervisor != cocoon.HypervisorCloudHypervisor {
		t.Fatalf("running payload: %+v", ev.VM)
	}

	// A crash changes nothing on disk: it shows at the next liveness tick as "stopped (stale)".
	if err := syscall.Kill(existing.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st.next(existing.ID, change{cocoon.EventModified, cocoon.VMStateStale})

	// vm stop ends the hypervisor, then records the VM stopped: a tick between the two shows it
	// stale first, as cocoon's stream may.
	s.ok("vm", "stop", "added")
	if ev := st.event(added.ID); (change{ev.Event, ev.VM.State}) == (change{cocoon.EventModified, cocoon.VMStateStale}) {
		st.next(added.ID, change{cocoon.EventModified, cocoon.VMStateStopped})
	} else if ev.Event != cocoon.EventModified || ev.VM.State != cocoon.VMStateStopped {
		t.Fatalf("after vm stop: got %s/%s, want MODIFIED/stopped (after MODIFIED/stale or not)", ev.Event, ev.VM.State)
	}
	s.ok("vm", "rm", "added")
	deleted := st.next(added.ID, change{cocoon.EventDeleted, cocoon.VMStateStopped})
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

// A clone seen while its placeholder is in the DB: ADDED/creating, then MODIFIED/running.
func TestStatusEventStreamSeesCreatingClone(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	gate := filepath.Join(t.TempDir(), "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.env = append(s.env, cocoonsim.CloneGateEnv+"="+gate)
	st := s.statusEvents("-n", "1")

	clone := exec.Command(simBinary, append(s.globalFlags(), "vm", "clone", "--name", "slow", "-o", "json", "base")...)
	clone.Env = append(os.Environ(), s.env...)
	var stderr bytes.Buffer
	clone.Stderr = &stderr
	if err := clone.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clone.Process.Kill(); _ = clone.Wait() })
	ev := st.next("slow", change{cocoon.EventAdded, cocoon.VMStateCreating})

	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	if err := clone.Wait(); err != nil {
		t.Fatalf("clone: %v: %s", err, stderr.String())
	}
	running := st.next(ev.VM.ID, change{cocoon.EventModified, cocoon.VMStateRunning})
	if running.VM.Config.Name != "slow" {
		t.Fatalf("running payload: %+v", running.VM)
	}
}

func TestStatusFiltersAndTextHeader(t *testing.T) {
	s := newSim(t)
	s.importSnapshot(testimage.SnapshotOptions{Name: "base"})
	a := s.clone("base", "alpha")
	s.clone("base", "beta")
	st := s.statusEvents("alpha")
	st.next(a.ID, change{cocoon.EventAdded, cocoon.VMStateRunning})
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

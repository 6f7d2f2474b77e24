package vmruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// Exit status of a container whose command could not be run in the guest.
const reasonGuestExecError = "GuestExecError"

// mainProcess is a container's command run in its guest as the container's main process: its
// output is the container's log, attach sessions see it and feed its stdin, and its exit is the
// container's.
type mainProcess struct {
	argv      []string
	tty       bool
	stdinOnce bool
	log       *streaming.LogWriter
	stdout    *streaming.Broadcast
	stderr    *streaming.Broadcast
	stdinR    *io.PipeReader // nil when the container takes no stdin
	stdinW    *io.PipeWriter

	mu       sync.Mutex
	attached bool // a StdinOnce container's stdin closes after its first attach session

	// adopted: the command was launched detached by an earlier cocoon-cri, and is followed again.
	adopted bool
	follow  followGate
}

func newMainProcess(cfg *runtimeapi.ContainerConfig, argv []string, log *streaming.LogWriter) *mainProcess {
	m := &mainProcess{
		argv: argv, tty: cfg.GetTty(), stdinOnce: cfg.GetStdinOnce(), log: log,
		stdout: streaming.NewBroadcast(), stderr: streaming.NewBroadcast(),
	}
	if cfg.GetStdin() {
		m.stdinR, m.stdinW = io.Pipe()
	}
	return m
}

// run runs the command through exec with the container's streams and returns its exit code.
func (m *mainProcess) run(exec func(streaming.ExecIO) (int, error)) (int, error) {
	stdio := streaming.ExecIO{Stdout: m.output(runtimeapi.Stdout, m.stdout), TTY: m.tty}
	stdio.Stderr = stdio.Stdout
	if !m.tty {
		stdio.Stderr = m.output(runtimeapi.Stderr, m.stderr)
	}
	if m.stdinR != nil {
		stdio.Stdin = m.stdinR
	}
	return exec(stdio)
}

// output is where one stream goes: the log, and any attached client.
func (m *mainProcess) output(stream runtimeapi.LogStreamType, b *streaming.Broadcast) io.Writer {
	if m.log == nil {
		return b
	}
	return io.MultiWriter(m.log.Stream(stream), b)
}

// attachStdin returns where an attach session's input goes, and what to call when the session's
// input ends; nil when the container takes no stdin (or a StdinOnce session already had it).
func (m *mainProcess) attachStdin() (io.Writer, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stdinW == nil || (m.stdinOnce && m.attached) {
		return nil, func() {}
	}
	m.attached = true
	if m.stdinOnce {
		return m.stdinW, func() { m.stdinW.Close() }
	}
	return m.stdinW, func() {}
}

func (m *mainProcess) close() {
	m.stdout.Close()
	m.stderr.Close()
	if m.stdinW != nil {
		m.stdinW.Close()
	}
}

// mainExited records the end of a container's main process: the container exits with the
// command's status and its VM is powered off, since the workload is done. A stop already under
// way (ctx cancelled) records the exit itself.
func (s *Runtime) mainExited(ctx context.Context, sandboxID, containerID string, code int, runErr error) {
	if ctx.Err() != nil {
		return
	}
	unlock := s.locks.Lock(sandboxID)
	defer unlock()
	c, err := s.store.Containers.Get(containerID)
	if err != nil || c.State != store.ContainerRunning {
		return
	}
	sb, err := s.store.Sandboxes.Get(sandboxID)
	if err != nil {
		return
	}
	if runErr != nil && !errors.Is(runErr, errMainProcessLost) && c.VM.PID > 0 && !hypervisorProcess(c.VM.PID, c.VM).Alive(procRoot) {
		// The command, or the guest's set-up before it, failed because the VM ended under it (a
		// crash, a power-off): the container ends as its VM did, which the VM watcher records.
		s.log.Info("the container's command failed as its VM ended; the VM's end is recorded", "container", containerID, "err", runErr)
		return
	}
	status := exitStatus{code: int32(code), reason: reasonCompleted, message: fmt.Sprintf("the command exited with %d", code)}
	if code != 0 {
		status.reason = reasonError
	}
	switch {
	case errors.Is(runErr, errMainProcessLost):
		status = exitStatus{code: killedExitCode, reason: reasonMainProcessLost, message: runErr.Error()}
	case runErr != nil:
		status = exitStatus{code: startErrorExitCode, reason: reasonGuestExecError, message: runErr.Error()}
	}
	if err := s.powerOff(context.WithoutCancel(ctx), sb, c, mainExitStopTimeout); err != nil {
		s.log.Error("powering off the VM of a finished command failed", "container", containerID, "err", err)
	}
	if err := s.recordExit(c, status); err != nil {
		s.log.Error("recording the end of the command failed", "container", containerID, "err", err)
	}
}

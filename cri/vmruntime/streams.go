package vmruntime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// ServeStreams starts the server the kubelet's exec, attach and port-forward streams go to, on
// addr (host:port; port 0 picks a free one). The caller runs and closes it.
func (s *Runtime) ServeStreams(addr string) (*streaming.Server, error) {
	srv, err := streaming.NewServer(addr, streamRuntime{s})
	if err != nil {
		return nil, err
	}
	s.streams = srv
	return srv, nil
}

// maxExecSyncOutput bounds what ExecSync keeps of each stream: a probe is not a way to copy files,
// and both streams together must fit the kubelet's 16 MiB gRPC messages.
const maxExecSyncOutput = 7 << 20

// ExecSync runs a command in the guest and returns its output and exit code. Past its timeout the
// command is killed and the RPC fails.
func (s *Runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if len(req.GetCmd()) == 0 {
		return nil, invalid("cmd is required")
	}
	if req.GetTimeout() < 0 {
		return nil, invalid("timeout must not be negative, got %d", req.GetTimeout())
	}
	sb, c, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if req.GetTimeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetTimeout())*time.Second)
		defer cancel()
	}
	release, err := s.inUse(ctx, c.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	// Read again: a wake records the VM's new hypervisor.
	if sb, c, err = s.runningContainer(c.ID); err != nil {
		return nil, err
	}
	stdout, stderr := &cappedBuffer{max: maxExecSyncOutput}, &cappedBuffer{max: maxExecSyncOutput}
	err = s.awaitGuestSetUp(ctx, c.ID)
	code := -1
	if err == nil {
		code, err = s.guest.run(ctx, sb, c, containerCommand(c.Config.Msg, req.GetCmd()), streaming.ExecIO{Stdout: stdout, Stderr: stderr})
	}
	if errors.Is(err, context.DeadlineExceeded) && req.GetTimeout() > 0 {
		// The command is not echoed: probe commands may carry tokens, and this reaches kubelet events.
		return nil, timedOut("the command timed out after %ds and was killed in the guest", req.GetTimeout())
	}
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: int32(code)}, nil
}

// Exec hands out the URL of an exec stream.
func (s *Runtime) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	if len(req.GetCmd()) == 0 {
		return nil, invalid("cmd is required")
	}
	if err := checkStreams(req.GetStdin(), req.GetStdout(), req.GetStderr(), req.GetTty()); err != nil {
		return nil, err
	}
	if _, _, err := s.runningContainer(req.GetContainerId()); err != nil {
		return nil, err
	}
	switch path, err := s.guest.path(ctx); {
	case err != nil:
		return nil, err
	case path == ExecPathNone:
		return nil, errNoExecPath
	}
	resp, err := s.streams.GetExec(req)
	return resp, err
}

// Attach hands out the URL of an attach stream: the main process's streams, or the VM's console
// for a container whose VM's init is the workload.
func (s *Runtime) Attach(_ context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	if err := checkStreams(req.GetStdin(), req.GetStdout(), req.GetStderr(), req.GetTty()); err != nil {
		return nil, err
	}
	if _, _, err := s.runningContainer(req.GetContainerId()); err != nil {
		return nil, err
	}
	resp, err := s.streams.GetAttach(req)
	return resp, err
}

// PortForward hands out the URL of a port-forward stream to the pod IP.
func (s *Runtime) PortForward(_ context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	for _, p := range req.GetPort() {
		if p <= 0 || p > 65535 {
			return nil, invalid("port %d is out of range", p)
		}
	}
	if _, err := s.sandboxAddress(req.GetPodSandboxId()); err != nil {
		return nil, err
	}
	resp, err := s.streams.GetPortForward(req)
	return resp, err
}

// ReopenContainerLog starts a new log file at the container's log path, after the kubelet renamed
// the old one.
func (s *Runtime) ReopenContainerLog(_ context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	_, c, err := s.runningContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	cio := s.ioOf(c.ID)
	if cio == nil || cio.log == nil {
		return nil, precondition("container %s writes no log (it has no log path)", c.ID)
	}
	if err := cio.log.Reopen(); errors.Is(err, streaming.ErrLogClosed) {
		return nil, precondition("container %s is not running: %v", c.ID, err)
	} else if err != nil {
		return nil, err
	}
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

// checkStreams refuses stream combinations no client can use.
func checkStreams(stdin, stdout, stderr, tty bool) error {
	if !stdin && !stdout && !stderr {
		return invalid("one of stdin, stdout and stderr must be requested")
	}
	if tty && stderr {
		return invalid("a terminal has no separate stderr: with tty, ask for stdout only")
	}
	return nil
}

// runningContainer looks up a container that runs, and its sandbox.
func (s *Runtime) runningContainer(idOrPrefix string) (*store.Sandbox, *store.Container, error) {
	c, err := s.findContainer(idOrPrefix)
	if err != nil {
		return nil, nil, err
	}
	if c.State != store.ContainerRunning {
		return nil, nil, precondition("container %s is %s, not running", c.ID, c.State)
	}
	sb, err := s.store.Sandboxes.Get(c.SandboxID)
	if err != nil {
		return nil, nil, err
	}
	return sb, c, nil
}

// runningContainerOf is the sandbox's running container (a sandbox runs at most one), or nil.
func (s *Runtime) runningContainerOf(sandboxIDOrPrefix string) *store.Container {
	sb, err := s.visibleSandbox(sandboxIDOrPrefix)
	if err != nil {
		return nil
	}
	for _, c := range s.sandboxContainers(sb.ID) {
		if c.State == store.ContainerRunning {
			return c
		}
	}
	return nil
}

// sandboxAddress is a ready sandbox's pod IP.
func (s *Runtime) sandboxAddress(idOrPrefix string) (string, error) {
	sb, err := s.visibleSandbox(idOrPrefix)
	if err != nil {
		return "", err
	}
	if sb.State != store.SandboxReady || sb.Network == nil || sb.Network.Released || len(sb.Network.IPs) == 0 {
		return "", precondition("pod sandbox %s has no pod IP to forward to (not ready)", sb.ID)
	}
	return sb.Network.IPs[0], nil
}

// streamRuntime serves the streams the stream server accepted.
type streamRuntime struct{ s *Runtime }

func (r streamRuntime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	_, c, err := r.s.runningContainer(containerID)
	if err != nil {
		return err
	}
	release, err := r.s.inUse(ctx, c.ID)
	if err != nil {
		return err
	}
	defer release()
	if err := r.s.awaitGuestSetUp(ctx, c.ID); err != nil {
		return err
	}
	// Read again: a wake records the VM's new hypervisor.
	sb, c, err := r.s.runningContainer(c.ID)
	if err != nil {
		return err
	}
	code, err := r.s.guest.run(ctx, sb, c, containerCommand(c.Config.Msg, cmd), streaming.ExecIO{Stdin: in, Stdout: out, Stderr: errw, TTY: tty, Resize: resize})
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

// Attach joins the container's output until the client leaves or the container stops; the
// client's input goes to the main process's stdin, or to the VM's console.
func (r streamRuntime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, _ <-chan remotecommand.TerminalSize) error {
	_, c, err := r.s.runningContainer(containerID)
	if err != nil {
		return err
	}
	release, err := r.s.inUse(ctx, c.ID)
	if err != nil {
		return err
	}
	defer release()
	cio := r.s.ioOf(c.ID)
	if cio == nil {
		return precondition("container %s is not running", c.ID)
	}
	var copies sync.WaitGroup
	following := false
	follow := func(sub func() (<-chan []byte, func()), w io.Writer) {
		if w == nil {
			return
		}
		following = true
		ch, stop := sub()
		context.AfterFunc(ctx, stop)
		copies.Go(func() {
			for chunk := range ch {
				if _, err := w.Write(chunk); err != nil {
					stop()
				}
			}
		})
	}
	var stdin io.Writer
	inputDone := func() {}
	if cio.main != nil {
		follow(cio.main.stdout.Subscribe, out)
		if !tty {
			follow(cio.main.stderr.Subscribe, errw)
		}
		if in != nil {
			// Only a session with input takes a StdinOnce container's one stdin.
			stdin, inputDone = cio.main.attachStdin()
		}
	} else {
		follow(cio.console.Subscribe, out)
		stdin = cio.console
	}
	if in != nil && stdin != nil {
		input := newSessionInput(stdin, inputDone)
		// The copy ends at the client's next read once the session is over: the stream server closes
		// the connection when Attach returns. Until then nothing more reaches the container.
		defer input.end()
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			_, _ = io.Copy(input, in)
			input.end()
		}()
		if !following {
			// An input-only session lasts as long as its input.
			select {
			case <-finished:
			case <-ctx.Done():
			}
		}
	}
	copies.Wait()
	return nil
}

// sessionInput passes an attach session's input on for as long as the session lasts: what the
// client sends after it ended is dropped, and its end (which closes a StdinOnce container's stdin)
// is reported once, at the first of the client closing its input and the session ending.
type sessionInput struct {
	w     io.Writer
	ended atomic.Bool
	once  sync.Once
	done  func()
}

func newSessionInput(w io.Writer, done func()) *sessionInput {
	return &sessionInput{w: w, done: done}
}

func (s *sessionInput) Write(p []byte) (int, error) {
	if s.ended.Load() {
		return 0, io.ErrClosedPipe
	}
	return s.w.Write(p)
}

func (s *sessionInput) end() {
	s.ended.Store(true)
	s.once.Do(s.done)
}

// PortForward connects the stream to the port on the pod IP, from the node; each direction closes
// on its own (half-close), and the forward ends when both have.
func (r streamRuntime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	ip, err := r.s.sandboxAddress(podSandboxID)
	if err != nil {
		return err
	}
	if c := r.s.runningContainerOf(podSandboxID); c != nil {
		release, err := r.s.inUse(ctx, c.ID)
		if err != nil {
			return err
		}
		defer release()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("connect to %s port %d: %w", ip, port, err)
	}
	defer conn.Close()
	tcp := conn.(*net.TCPConn)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(tcp, stream)
		_ = tcp.CloseWrite()
	})
	_, err = io.Copy(stream, tcp)
	wg.Wait()
	return err
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

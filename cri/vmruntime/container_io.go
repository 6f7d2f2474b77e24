package vmruntime

import (
	"context"
	"io"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cocoonstack/cocoon-cri/pkg/store"
	"github.com/cocoonstack/cocoon-cri/streaming"
)

// containerIO is a running container's streams, held in memory while it runs: its CRI log, its
// VM's console, and, for a container with a command, that command as its main process.
type containerIO struct {
	log     *streaming.LogWriter // nil when the kubelet asked for no log
	console *streaming.Console
	main    *mainProcess // nil for a container whose VM's own init is the workload
	cancel  context.CancelFunc
	// setUp is closed once the guest has been configured for the pod (or given up on): commands
	// wait for it, so they see the pod's hostname and resolvers.
	setUp chan struct{}
	// resumeGuest, set for a VM that hibernated when its streams were opened (a restart of
	// cocoon-cri), runs the guest's set-up and main process once the VM wakes.
	resumeGuest func()
}

// consoleStopWait bounds how long a stop waits for the console reader to let go.
const consoleStopWait = 5 * time.Second

// mainCommand is what runs as a container's main process: its command and args. A VM image has no
// entrypoint to prepend args to, so args alone are the command.
func mainCommand(cfg *runtimeapi.ContainerConfig) []string {
	return append(append([]string(nil), cfg.GetCommand()...), cfg.GetArgs()...)
}

// startIO opens a started container's streams. The console is always read, so the guest never
// stalls on it; it is the container's log when the VM's init is the workload. Guest setup and the
// main process run in the background: StartContainer does not wait for a booting guest.
func (s *Runtime) startIO(sb *store.Sandbox, c *store.Container) {
	ctx, cancel := context.WithCancel(context.Background())
	cio := &containerIO{cancel: cancel, setUp: make(chan struct{})}
	log := s.log.With("container", c.ID, "vm", c.VM.Name)
	if c.LogPath != "" {
		w, err := streaming.OpenLog(c.LogPath, log)
		if err != nil {
			log.Error("cannot write the container log", "path", c.LogPath, "err", err)
		} else {
			cio.log = w
		}
	}
	argv := mainCommand(c.Config.Msg)
	var consoleSink io.Writer
	if len(argv) == 0 && cio.log != nil {
		consoleSink = cio.log.Stream(runtimeapi.Stdout)
	}
	apiSocket, hypervisor := c.VM.APISocket, c.VM.Backend
	cio.console = streaming.NewConsole(func(ctx context.Context) (io.ReadWriteCloser, error) {
		// Asked anew at each connection: a restarted hypervisor has a new PTY.
		open, err := streaming.FindConsole(ctx, hypervisor, apiSocket)
		if err != nil {
			return nil, err
		}
		return open(ctx)
	}, consoleSink, log)
	if len(argv) > 0 {
		cio.main = newMainProcess(c.Config.Msg, argv, cio.log)
		cio.main.adopted = c.MainDetached
	}
	s.iosMu.Lock()
	s.ios[c.ID] = cio
	s.iosMu.Unlock()

	go cio.console.Run(ctx)
	if c.VM.Hibernated() {
		cio.resumeGuest = sync.OnceFunc(func() { go s.runGuest(ctx, sb, c, cio) })
		return
	}
	go s.runGuest(ctx, sb, c, cio)
}

// runGuest prepares the guest (its network, hostname and resolvers, where cocoon could not, its
// block devices and its volumes) and then runs the main process, if any.
func (s *Runtime) runGuest(ctx context.Context, sb *store.Sandbox, c *store.Container, cio *containerIO) {
	if !c.VM.Pooled {
		// A pool VM's guest was set up at its hand-over.
		s.setUpGuest(ctx, sb, c)
	}
	takesCopies := s.volumes.guestTakesCopies(ctx, c)
	if !takesCopies && len(c.Config.Msg.GetMounts()) > 0 {
		s.log.Info("the kubelet's /etc/hosts and termination log are left out: the guest takes no copies (no way into it, or Windows)",
			"container", c.ID)
	}
	volumes := containerVolumes(c.Config.Msg, takesCopies)
	if takesCopies && s.shares.canShare(ctx, c) {
		if shared, copied := splitShared(volumes); len(shared) > 0 && s.shares.share(ctx, sb, c, shared) == nil {
			volumes = copied
		}
	}
	err := s.linkDevices(ctx, sb, c)
	if err == nil {
		err = s.volumes.deliver(ctx, sb, c, volumes)
	}
	if err != nil {
		// The workload must not run without its devices and volumes: the container exits with the
		// reason.
		close(cio.setUp)
		s.mainExited(ctx, sb.ID, c.ID, -1, err)
		return
	}
	s.log.Info("the guest has the container's devices and volumes", "container", c.ID,
		"devices", len(c.Config.Msg.GetDevices()), "volumes", len(volumes))
	close(cio.setUp)
	go s.volumes.keepInStep(ctx, sb, c, volumes, s.log.With("container", c.ID, "vm", c.VM.Name))
	if cio.main != nil {
		code, err := s.runMain(ctx, sb, c, cio.main)
		s.mainExited(ctx, sb.ID, c.ID, code, err)
	}
}

// stopIO closes a container's streams. It does not wait for the main process's goroutine, which
// may be waiting for the sandbox lock the caller holds; that goroutine finds the container no
// longer running and returns.
func (s *Runtime) stopIO(containerID string) {
	s.iosMu.Lock()
	cio := s.ios[containerID]
	delete(s.ios, containerID)
	s.iosMu.Unlock()
	if cio == nil {
		return
	}
	cio.cancel()
	select {
	case <-cio.console.Done():
	case <-time.After(consoleStopWait):
		s.log.Warn("the console reader did not stop in time", "container", containerID)
	}
	if cio.main != nil {
		cio.main.close()
	}
	if cio.log != nil {
		if err := cio.log.Close(); err != nil {
			s.log.Warn("closing the container log failed", "container", containerID, "err", err)
		}
	}
}

// awaitGuestSetUp waits, within ctx, until the container's guest is configured for the pod.
func (s *Runtime) awaitGuestSetUp(ctx context.Context, containerID string) error {
	cio := s.ioOf(containerID)
	if cio == nil {
		return nil
	}
	select {
	case <-cio.setUp:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Runtime) ioOf(containerID string) *containerIO {
	s.iosMu.Lock()
	defer s.iosMu.Unlock()
	return s.ios[containerID]
}
